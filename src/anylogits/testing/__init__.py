"""Test helpers for anylogits: tiny deterministic models and fixtures shared by tests and demos."""
