"""Seconds per round and peak RSS against the number of clients N (README.md)."""
