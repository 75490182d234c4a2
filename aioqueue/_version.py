"""The installed version: a module of its own, so that the registry and the command line can
read it without importing the package root (which imports them)."""

__version__ = "0.1.0"
