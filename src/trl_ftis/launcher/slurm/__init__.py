"""The SLURM backend (`launcher: slurm`, or `trl-ftis swarm --slurm`): every peer of a swarm is one SLURM job.

One concern per module:

* `schema`: its section of the swarm config, the `slurm:` resources (top level and per peer) and the `redis:` job.
* `cli`: the SLURM commands it runs (`squeue`, `scontrol`, `scancel`) and the batch script submitit writes.
* `jobs`: what runs inside the jobs (`PeerJob`, `RedisJob`, `ServerJob`).
* `watch`: following the submitted jobs (`JobWatch`, the exit files).
* `backend`: `SlurmBackend`, the `launcher.backend.Backend` the driver runs.
"""
