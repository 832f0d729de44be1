"""Remedies for what diagnose finds: configuration remedies (Dynamo settings, the user's code
unchanged) and source rewrites of a copy of the user's files, measured by the tune like any
other variant (`+fix=...`) and shipped as configuration lines and a unified diff."""
