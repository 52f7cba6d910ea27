"""Todo-list MCP server for crow."""

from mcp_servers.todos.server import Todo, TodoServer, build_server

__all__ = ["Todo", "TodoServer", "build_server"]
