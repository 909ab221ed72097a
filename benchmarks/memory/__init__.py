"""Peak memory (RSS and PSS) of a command's whole process tree (README.md)."""
