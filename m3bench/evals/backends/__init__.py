"""Backends an evaluation talks to: the bundled runtime, an OpenAI-compatible server, transformers."""
