"""The chaos harness: streaming pipelines killed on seeded schedules, then verified exactly once.

- ``schedule``: the seeded events (protocol points, outages, timed kills) of one pipeline;
- ``runner``: one pipeline started, killed on its schedule, restarted until drained;
- ``pipeline`` (the child process of one start) and ``spec`` (what a start runs);
- ``pipelines/``: one module per sink: what it writes, which servers it may kill, its check;
- ``servers``: where the servers are, and how one is crashed and brought back;
- ``report``: the result of a run, the soak's table and JSON;
- ``progress``: a pipeline's live row while the soak runs, on a terminal only;
- ``cluster``: the runner on the compose cluster (drivers in containers, faults of nodes);
- ``setup``: the steps of one pipeline end to end; ``__main__``: the soak (``make chaos``);
  ``test_chaos``: the bounded profile of ``make test``; ``test_cluster_chaos``: the cluster's
  (``make test-cluster``).
"""
