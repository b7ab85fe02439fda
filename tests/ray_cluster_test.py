"""How the launcher reads the cluster it joins (no cluster needed)."""

def test_a_cluster_slower_to_report_a_lost_node_than_the_heartbeat_timeout_is_warned_of():
    from mecefo_jax.launch.cluster import node_loss_warning
    ray_default = {'period_ms': 3000, 'timeout_ms': 10000, 'failure_threshold': 5}
    local = {'period_ms': 500, 'timeout_ms': 500, 'failure_threshold': 3}
    warning = node_loss_warning(ray_default, heartbeat_timeout_sec=20.0)
    assert 'up to 65 s' in warning and '"health_check_period_ms":500' in warning
    assert node_loss_warning(local, heartbeat_timeout_sec=20.0) is None
    assert node_loss_warning(local, heartbeat_timeout_sec=3.0) is None  # 3 s: within it
