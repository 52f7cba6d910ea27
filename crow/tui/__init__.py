"""crow's terminal front end: `crow chat` (and bare `crow` on a terminal) and `crow run`'s
rendering on a terminal. Built on rich (rendering) and prompt_toolkit (input), imported
only here: the ACP path never loads them.

- `render.Renderer`: the loop's events as the terminal shows them (Markdown answer,
  reasoning, status line, tool lines, diffs, plan, notices);
- `chat`: the interactive session (input, history, completion, Ctrl-C / Ctrl-D);
- `questions.ChatClient`: the `EditorClient` that asks permissions and `ask_user`
  questions as pickers.
"""
