"""The package version, in a module of its own so that any module can name it without importing the package's
public surface (tensat/__init__.py), which sits above every other module."""

__version__ = "0.1.0"
