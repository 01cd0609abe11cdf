"""Repros and reports: standalone pytest files from stored figures and issue reports ready to file upstream."""
