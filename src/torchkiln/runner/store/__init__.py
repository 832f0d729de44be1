"""Run storage: the run directory's layout and reusing results of an earlier run into it."""
