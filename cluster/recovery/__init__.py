"""Keeping a job alive: what recovery rests on, and the windows it accepts.

The rooms: the watch loop's policy (policy.py: a poll's Status -> a
Decision), the supervisor that carries recoveries out (supervisor.py, the
one owner of rollbacks, generations and redirects), the progress ledger
(ledger.py), a node lost for good (node_loss.py), spare workers
(spares.py), worker liveness (liveness.py), where checkpoints go
(checkpoint_plan.py) and clean stops on a signal (interrupts.py). Where
every actor runs is the job's Placements (cluster/run/placements.py).
Internal. Imports nothing itself.

Invariants (each is what some part of recovery relies on; break one and
a recovered run no longer ends as the uninterrupted one would have):

 1. A checkpoint is complete only when every shard's part of it is stored
    (MANIFEST.json, ps/checkpoint.py), and a recovery only ever goes back
    to a complete one. Every shard's part holds its parameters, optimizer
    state and exactly-once table, and each worker's clock.
 2. After any recovery every shard is at the same checkpoint version c:
    dead shards start from their part of c, live ones roll back to it. A
    sync step never mixes versions.
 3. Going back to c deletes every checkpoint folder newer than c, after
    each live shard has flushed its part writer: no part of the abandoned
    history can complete a checkpoint beside parts of the replayed one.
 4. A shard applies a push at most once: (rank, step) in sync mode,
    (rank, clock) in async and ssp, in its exactly-once table; a push it
    already applied is answered DUPLICATE.
 5. A global batch is a function of (seed, step) and a sync step sums its
    pushes in rank order, so in sync mode the steps a rollback makes again
    compute exactly the bits that were lost (the parity oracle: N workers x
    T towers end with one process's weights, recovered or not).
 6. Only the supervisor's `_roll_back` starts a generation: the shards go
    back first, then one Redirect (the shards' addresses and nodes, c, each
    async/ssp worker's clock in c, the ranks training) goes to every live
    worker. A worker acts on a Redirect newer than its own generation only;
    a run that ended under an older generation runs again (`behind`).
 7. A rank is never trained by two live actors: a worker judged dead is
    `ray.kill`ed before its replacement starts (liveness.py), and a rank
    keeps its token, rows and exactly-once entries across replacements.
 8. Whenever an actor dies the supervisor asks first whether a node of the
    job was lost, and recovers a lost node's actors together, once. A new
    actor is never waited for in a bundle whose node is lost
    (cluster/run/remote.py `get_in_bundle`).
 9. The ledger counts each version once, from shard 0's update log; the
    versions a rollback makes again were counted when first made, and the
    versions no live shard has records of (a replaced shard 0) count one
    update's share of a global batch each. `summary.json`'s `steps` and
    `examples` describe the final history, whatever was replayed.
10. The job's Placements hold one record per (role, index), the current
    actor's; placement.json is rewritten on every change. A worker lost
    with its node keeps its record, marked `lost`, and is never replaced.

Windows (what happens at the awkward moments; those marked "open" are
accepted, not closed):

- A worker dies between its push and its pull: its push reached every
  shard, so their tables agree on its latest step; the replacement starts
  at the next step, nothing is rolled back.
- A worker dies in the middle of a push that reached only some shards: the
  tables disagree, a shard may already have applied it, and no push can
  make it whole; every shard and worker goes back to the latest complete
  checkpoint. Open: a push fully sent before the process died but read by
  its shard only after the supervisor read the tables is missed by this
  check (Ray reports a death well after the process's sockets closed).
- A shard dies mid-checkpoint: its part of that version is missing, the
  version never completes, and the recovery goes back to the newest
  complete one. Open: a part the dead shard's process handed to storage
  just before it died can still land afterwards.
- A shard and a worker die together, or several shards: one ping finds
  every dead shard and one rollback covers them all; the worker's
  replacement starts from that rollback's version.
- A worker's run has ended (it pushed its last step) when a rollback
  comes: the steps made again need it, so it runs again, in a new actor if
  it died meanwhile.
- Ray reports an actor's death before its node's: the replacement asked
  into the bundle on the dying node is killed once the node is found lost,
  and the node's recovery follows (the spare's loss only moves on to the
  next spare).
- The heartbeat judges a slow worker dead: it is killed before it is
  replaced, and a push of it that lands meanwhile is applied once (the
  replacement's push of the same step is DUPLICATE).
- A worker dies while a recovery redirects the workers: it is skipped, and
  the next poll replaces it. Any other death during a recovery (a shard
  dying while the others roll back, a replacement dying while it starts
  on a live node) fails the run; its latest complete checkpoint resumes
  it (`towerps train --resume`).
- The driver dies: no recovery inside the job; `--resume` goes on from the
  latest complete checkpoint and ends as the uninterrupted run (sync: bit
  for bit).
- Async and ssp: every recovery keeps each global batch applied once, but
  the replayed pushes interleave anew, so the weights differ from a clean
  run's as two async runs do.
- A node lost for good: sync mode on data read by step only (async, ssp or
  a stream end the run with a RecoveryFailed naming why); the survivors
  share each global batch, which is the same mean gradient up to float32
  rounding, not bit for bit. Open: a shard started on the last node
  standing binds 127.0.0.1, which a driver on another machine cannot reach.
- A worker fed by a Ray Data stream is not replaced: its split's position
  is in no checkpoint.
"""
