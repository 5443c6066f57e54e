"""The m3bench command line: one module per command, assembled in main.py."""
