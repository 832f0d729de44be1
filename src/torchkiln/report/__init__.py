"""Reports: terminal tables, the JSON schema of results."""
