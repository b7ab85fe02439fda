"""The entry point's dispatch: which controller a config selects, and its errors."""

import pytest

from configs.tiny import get_config
from mecefo_jax.config.defaults import ConfigError
from mecefo_jax.config.resolve import resolve


@pytest.mark.parametrize('field', ['mttr_hours', 'mtbf_hours'])
def test_half_a_custom_failure_process_is_an_error_not_a_silent_fault_free_run(field):
    cfg = get_config()
    cfg.fault[field] = 2.0  # the other one left at 0: almost surely a typo
    # Refused when the config is resolved, before run.run could start anything (the rule is
    # checked there, once: nothing downstream checks it again).
    with pytest.raises(ConfigError, match=r'fault\.mttr_hours=.*fault\.mtbf_hours='):
        resolve(cfg)
