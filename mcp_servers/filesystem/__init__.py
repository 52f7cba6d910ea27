"""Filesystem MCP server for crow: file tools confined to one workspace root."""

from mcp_servers.filesystem.backend import Backend, BinaryFileError, LocalBackend
from mcp_servers.filesystem.execute import ExecResult
from mcp_servers.filesystem.files import Files, Place
from mcp_servers.filesystem.localfiles import LocalFiles
from mcp_servers.filesystem.paths import Workspace
from mcp_servers.filesystem.server import DIFF_META_KEY, build_server

__all__ = [
    "DIFF_META_KEY",
    "Backend",
    "BinaryFileError",
    "ExecResult",
    "Files",
    "LocalBackend",
    "LocalFiles",
    "Place",
    "Workspace",
    "build_server",
]
