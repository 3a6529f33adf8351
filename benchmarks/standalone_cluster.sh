#!/usr/bin/env bash
# A Spark standalone cluster on this machine, from pyspark's own distribution, for benchmarks:
# one master and N workers on 127.0.0.1 (as tests/integration/test_cluster.py starts them).
#
#   benchmarks/standalone_cluster.sh start [WORKERS] [CORES] [MEMORY]   # default 2 workers, 1 core, 4g each
#   python benchmarks/infer.py --master spark://127.0.0.1:7077 ...
#   benchmarks/standalone_cluster.sh stop
#
# Logs and work folders go to $CLUSTER_DIR (default /tmp/lumos-standalone).
set -euo pipefail
DIR=${CLUSTER_DIR:-/tmp/lumos-standalone}
SPARK_HOME=$(python -c 'import pathlib, pyspark; print(pathlib.Path(pyspark.__file__).parent)')
export SPARK_HOME SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=${PYSPARK_PYTHON:-$(command -v python)}
export SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"
PORT=${SPARK_MASTER_PORT:-7077}

daemon() {  # spark-class ends in `exec java`: the PID written is the daemon's own
    local name=$1; shift
    setsid "$SPARK_HOME/bin/spark-class" "$@" > "$DIR/$name.log" 2>&1 &
    echo $! >> "$DIR/pids"
}

case ${1:-} in
start)
    workers=${2:-2} cores=${3:-1} memory=${4:-4g}
    mkdir -p "$DIR" && : > "$DIR/pids"
    daemon master org.apache.spark.deploy.master.Master --host 127.0.0.1 --port "$PORT" --webui-port 0
    for number in $(seq 1 "$workers"); do
        mkdir -p "$DIR/worker-$number"
        daemon "worker-$number" org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --cores "$cores" \
            --memory "$memory" --webui-port 0 --work-dir "$DIR/worker-$number" "spark://127.0.0.1:$PORT"
    done
    for _ in $(seq 300); do
        [ "$(grep -c 'Registering worker' "$DIR/master.log" 2>/dev/null || true)" -ge "$workers" ] && break
        sleep 1
    done
    registered=$(grep -c 'Registering worker' "$DIR/master.log" || true)
    [ "$registered" -ge "$workers" ] || { echo "only $registered of $workers workers registered; see $DIR/*.log" >&2; exit 1; }
    echo "spark://127.0.0.1:$PORT ($workers workers, $cores core(s) and $memory each; logs in $DIR)"
    ;;
stop)
    [ -f "$DIR/pids" ] && xargs -r kill < "$DIR/pids" 2>/dev/null || true
    rm -f "$DIR/pids"
    ;;
*)
    echo "usage: $0 start [WORKERS] [CORES] [MEMORY] | stop" >&2; exit 2
    ;;
esac
