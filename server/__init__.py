"""Muster scheduler server."""
