"""A stdio MCP server with prompts, for the slash-command tests: `greet` (a required and an
optional argument), `picture` (text and an image), and a tool that adds a prompt and says
so with `notifications/prompts/list_changed`."""

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import Prompt

server = MCPServer("prompts")

PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@server.prompt(description="Greet someone")
def greet(name: str, style: str = "plain") -> str:
    return f"Say hello to {name}, in a {style} way."


@server.prompt(description="Describe a picture")
def picture() -> list[dict]:
    return [
        {"role": "user", "content": {"type": "text", "text": "What is in this picture?"}},
        {"role": "user", "content": {"type": "image", "data": PIXEL, "mimeType": "image/png"}},
    ]


@server.tool()
async def add_prompt(ctx: Context) -> str:
    """Add the prompt `farewell` and tell the client."""

    def farewell() -> str:
        return "Say goodbye."

    server.add_prompt(Prompt.from_function(farewell, name="farewell", description="Say goodbye"))
    await ctx.session.send_prompt_list_changed()
    return "added"


if __name__ == "__main__":
    server.run()
