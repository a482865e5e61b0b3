"""Logs, explain, reports: how kiln tells the user what happened."""
