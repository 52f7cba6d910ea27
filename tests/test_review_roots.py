"""Review findings on multi-root sessions and images (issue 13): each a defect once."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio


def test_a_tool_result_with_hundreds_of_images_keeps_a_prompts_worth() -> None:
    # Every image a result keeps is re-sent with each later request of the session: a hostile
    # MCP server answering with 300 screenshots would hold them all in memory and in the store,
    # and past a provider's per-request limit (Anthropic: 100) fail every later turn. A result
    # keeps what a prompt may carry; the rest become one note the model can read.
    import base64

    from mcp_types import CallToolResult, ImageContent, TextContent

    from crow import images
    from crow.messages import ToolCall
    from crow.tools import to_tool_result
    from tests.support.images import png

    data = base64.b64encode(png()).decode()
    content = [TextContent(type="text", text="shots")]
    content += [ImageContent(type="image", data=data, mime_type="image/png") for _ in range(300)]
    out = to_tool_result(ToolCall("c", "snap"), CallToolResult(content=content))
    assert len(out.images) == images.MAX_PER_PROMPT
    assert out.output.splitlines() == [
        "shots",
        f"[280 more images were removed here: a tool result keeps at most {images.MAX_PER_PROMPT}]",
    ]
