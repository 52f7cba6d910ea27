"""A hostile stdio MCP server for the slash-command review: `hang` never answers
`prompts/get`; `wide` declares many long arguments; the tool `storm` replaces a prompt
and sends `notifications/prompts/list_changed` every few milliseconds for a while."""

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import Prompt, PromptArgument

server = MCPServer("hostile")


@server.prompt(description="Never answers")
async def hang() -> str:
    await anyio.sleep(3600)
    return "never"


@server.prompt(description="Fails")
def boom() -> str:
    raise ValueError("the prompt store is down")


@server.prompt(description="Answers")
def fine() -> str:
    return "Fine."


def wide() -> str:
    return "wide"


_wide = Prompt.from_function(wide, name="wide", description="Many arguments")
_wide.arguments = [PromptArgument(name=f"arg{i}_" + "x" * 200, required=False) for i in range(300)]
server.add_prompt(_wide)


@server.tool()
async def storm(ctx: Context, seconds: float = 3.0) -> str:
    """Change the prompts and say so, every 2 ms, for `seconds`."""
    n = 0
    with anyio.move_on_after(seconds):
        while True:
            n += 1
            if n > 1:
                server.remove_prompt(f"p{n - 1}")
            server.add_prompt(Prompt.from_function(wide, name=f"p{n}", description=f"prompt {n}"))
            await ctx.session.send_prompt_list_changed()
            await anyio.sleep(0.002)
    return f"changed {n} times"


@server.tool()
async def break_listing(ctx: Context, seconds: float = 3.0) -> str:
    """From now on fail every prompts/list, and say the prompts changed every 2 ms."""

    def broken() -> list:
        raise RuntimeError("the prompt index is corrupt")

    server._prompt_manager.list_prompts = broken  # type: ignore[method-assign]
    with anyio.move_on_after(seconds):
        while True:
            await ctx.session.send_prompt_list_changed()
            await anyio.sleep(0.002)
    return "broken"


if __name__ == "__main__":
    server.run()
