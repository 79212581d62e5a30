"""Keeping a job alive: the supervisor (supervisor.py) and what it calls on —
spare workers, worker liveness, a node lost for good, where checkpoints go,
and clean stops on a signal. Internal. Imports nothing itself."""
