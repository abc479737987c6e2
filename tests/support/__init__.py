"""Helpers shared by the test suites: a process harness and a raw protocol client."""
