"""The entry point's dispatch: which controller a config selects, and its errors."""
import pytest

from configs.tiny import get_config
from mecefo_jax import main


@pytest.mark.parametrize('field', ['mttr_hours', 'mtbf_hours'])
def test_half_a_custom_failure_process_is_an_error_not_a_silent_fault_free_run(field, tmp_path):
    cfg = get_config()
    cfg.fault[field] = 2.0  # the other one left at 0: almost surely a typo
    with pytest.raises(ValueError, match='fault.mtbf_hours and fault.mttr_hours'):
        main.run(cfg, str(tmp_path))
