#!/bin/sh
# Slurm prolog (Prolog= in slurm.conf) where a systemd unit is not an option: start the node
# agent once per node; it finds each job's ranks as they start and drops them as they end.
pgrep -f "loadertop export --all" >/dev/null 2>&1 || \
  setsid /usr/local/bin/loadertop export --all --listen 0.0.0.0:9464 >/var/log/loadertop-agent.log 2>&1 < /dev/null &
exit 0
