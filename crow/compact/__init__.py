"""Compaction: replace the old part of a session's context with a model-written summary.

    cut.py      what to compact (pure): should_compact, cut_point, closed_prefix
    request.py  what to ask the model and what replaces the old part (pure)
    service.py  CompactService: `due` (the one "should we compact") and `compact`

`cut_point` keeps the recent 10% of messages (at least 2) and never separates an assistant
message with tool calls from its results: the cut moves earlier until it lands on a
message that is not a tool result.
"""

from crow.compact.cut import cut_point, should_compact
from crow.compact.request import prefix_share, render, summary_message
from crow.compact.service import CompactResult, CompactService

__all__ = [
    "CompactResult",
    "CompactService",
    "cut_point",
    "prefix_share",
    "render",
    "should_compact",
    "summary_message",
]
