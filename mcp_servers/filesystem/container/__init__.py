"""Running the filesystem tools inside a container, through the Docker Engine API."""
