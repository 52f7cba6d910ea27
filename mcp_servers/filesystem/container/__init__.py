"""The container backend: the file tools and execute inside a container (Docker Engine API)."""
