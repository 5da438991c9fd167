"""NIXL's package name, answered by gdr's drop-in (see ../README.md)."""
