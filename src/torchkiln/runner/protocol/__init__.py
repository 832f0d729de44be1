"""The trial protocol, inside a trial's process: the spec, the worker, building arms under
common settings, and the order of measurement."""
