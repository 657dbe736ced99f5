"""The stream layer: the Kafka batch loop and the paths it drives.

The loop (`loop.py`) runs one path on the Kafka runtime (`runtime/`: intake, checkpoint, settlement, dead
letters, outages, retry, containment); each input topic has a path implementing the loop↔path contract
(`contract.py`, base classes in `handler.py`): `recall.py`, `persist.py`, `commands.py`. Shared by the paths:
per-thread lanes (`lanes.py`, the worker SDK's too), the turn barrier and gate (`barrier.py`, `turn_gate.py`),
parked requests (`parking.py`) and the per-batch storage round trips (`prefetch.py`, `collect.py`). README:
"Where to change what" and "consumers/runtime".
"""
