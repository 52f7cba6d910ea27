"""The ACP adapter: protocol in, events out (server, sessions, conversions, client
calls, view, wire)."""
