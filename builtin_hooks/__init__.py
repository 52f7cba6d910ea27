"""crow's builtin hooks. Each is an ordinary hook on crow's public API (`from crow import
...` only, and no builtin imports another): anything one does, a hook installed from PyPI
can do the same way.

They are found like any installed plugin, through the `crow.hooks` entry points crow's own
pyproject.toml declares (`crow.plugins`); being crow's, they form the stack's first band,
in the order of their `order` attributes.
"""
