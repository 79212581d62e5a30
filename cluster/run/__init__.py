"""Running a job: the driver's phases (driver.py), the actors (actors.py) and
their bundles (reservation.py), the Ray session, the job's credentials, the
user's model and data, and the loop that watches the run (monitor.py).
Internal. Imports nothing itself: a shard actor loads actors.py without
TensorFlow."""
