"""In-place tuning: `loadertop.watch(loader, tune=True)` changes num_workers and
prefetch_factor while the job trains, and keeps what it measures faster."""
