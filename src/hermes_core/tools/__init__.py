"""Concrete tools (calculator, clock, files, shell, clarify, MCP) and tool routing.

The tool seam itself (`@tool`, `ToolRegistry`) is hermes_core.kernel.tools; its names are
re-exported here, so `from hermes_core.tools import tool` keeps working.
"""

from ..kernel.tools import Tool, ToolContext, ToolError, ToolRegistry, tool

__all__ = ["Tool", "ToolContext", "ToolError", "ToolRegistry", "tool"]
