"""Tests of the host agent (plain pytest; no Django)."""
