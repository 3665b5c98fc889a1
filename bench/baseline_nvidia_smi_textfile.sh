#!/usr/bin/env bash
# Baseline for bench/gpu_collector_bench.py: the common cron job that the gpufleet
# collector replaces. One nvidia-smi call for six fields, formatted with read/echo,
# written with tmp + mv. Usage: baseline_nvidia_smi_textfile.sh OUTPUT_DIR
set -u
out_dir=${1:?usage: $0 OUTPUT_DIR}
tmp="$out_dir/nvidia_smi.prom.$$"
{
    echo "# TYPE node_gpu_memory_total_bytes gauge"
    echo "# TYPE node_gpu_memory_used_bytes gauge"
    echo "# TYPE node_gpu_utilization_percent gauge"
    echo "# TYPE node_gpu_temperature_celsius gauge"
    echo "# TYPE node_gpu_power_draw_watts gauge"
    echo "# TYPE node_gpu_power_limit_watts gauge"
    nvidia-smi --query-gpu=index,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,power.limit \
        --format=csv,noheader,nounits |
        while IFS=', ' read -r idx mem_total mem_used util temp power limit; do
            echo "node_gpu_memory_total_bytes{gpu=\"$idx\"} $((mem_total * 1048576))"
            echo "node_gpu_memory_used_bytes{gpu=\"$idx\"} $((mem_used * 1048576))"
            echo "node_gpu_utilization_percent{gpu=\"$idx\"} $util"
            echo "node_gpu_temperature_celsius{gpu=\"$idx\"} $temp"
            echo "node_gpu_power_draw_watts{gpu=\"$idx\"} $power"
            echo "node_gpu_power_limit_watts{gpu=\"$idx\"} $limit"
        done
} >"$tmp" && mv "$tmp" "$out_dir/nvidia_smi.prom"
