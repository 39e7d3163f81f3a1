"""A run's scheduling state as a fold over its ordered event log: no I/O here.

- ``events``: the log's events (what storage writes and reads back);
- ``prompt_ids``: a run's prompt ids, ordinal ↔ id, without a Python object per id;
- ``state``: ``RunState``, the reducer (``apply``) and the read view;
- ``shadow``: the read view's refresh (``copy.deepcopy`` into an earlier copy's buffers).

Nothing here imports the service's other layers; ``storage`` imports ``events`` only.
"""
