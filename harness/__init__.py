"""A benchmark harness for deep metric learning: one fixed protocol, many methods, honest numbers."""

__version__ = "0.1.0"
