"""Model back-ends. Importing this package does not import any HTTP library."""

from ..kernel.model import ModelClient, ModelError, ModelRequestRejected, ModelUnavailable

__all__ = ["ModelClient", "ModelError", "ModelRequestRejected", "ModelUnavailable"]
