export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 DO_NOT_TRACK=true PREFECT_SERVER_ANALYTICS_ENABLED=false
export MLFLOW_DISABLE_TELEMETRY=true DVC_NO_ANALYTICS=1 GX_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PREFECT_HOME=/work/wt-prefect/.state/prefect DVC_SITE_CACHE_DIR=/work/wt-prefect/.state/dvc-site-cache
export MPLCONFIGDIR=/work/wt-prefect/.state/matplotlib TORCH_EXTENSIONS_DIR=/work/main/.state/torch_extensions
export PATH=/work/main/.venv/bin:$PATH PYTHONPATH=/work/wt-prefect
