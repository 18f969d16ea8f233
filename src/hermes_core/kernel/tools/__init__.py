"""The tool seam: declaring tools, and the registry the loop executes them through."""

from .declare import Tool, ToolContext, ToolError, tool
from .registry import ToolRegistry

__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "tool"]
