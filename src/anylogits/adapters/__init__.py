"""Thin adapters, one module per backend; each imports its backend only when used."""
