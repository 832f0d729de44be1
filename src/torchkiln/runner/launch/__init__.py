"""Starting and ending processes: the one process-group spawner, a trial's process and its limits,
the executors that run many trials, the host lock they take turns on, and ending orphans."""
