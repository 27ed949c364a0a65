    dro_beta: Optional[float] = None
    stapo_tau_p: float = 0.002
    stapo_entropy_quantile: float = 0.75
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)

    def __post_init__(self):
        """Validate the STAPO thresholds (https://arxiv.org/abs/2602.15620, §3)."""

        def _is_real(value) -> bool:
            return isinstance(value, int | float) and not isinstance(value, bool)

        if not (_is_real(self.stapo_tau_p) and 0.0 < self.stapo_tau_p < 1.0):
            raise ValueError(
                f"policy_loss.stapo_tau_p={self.stapo_tau_p!r} is out of range: allowed 0 < stapo_tau_p < 1"
            )
        if not (_is_real(self.stapo_entropy_quantile) and 0.0 < self.stapo_entropy_quantile <= 1.0):
            raise ValueError(
                f"policy_loss.stapo_entropy_quantile={self.stapo_entropy_quantile!r} is out of range: "
                "allowed 0 < stapo_entropy_quantile <= 1"
            )
