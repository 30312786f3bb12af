"""Helpers the tests share, imported from here rather than from other test files."""
