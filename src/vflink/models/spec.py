"""Public hyperparameters of a party's bottom model; they may cross the party boundary."""

from __future__ import annotations

from dataclasses import dataclass

from vflink._checks import check_choice, check_float, check_int, raise_if

__all__ = ["ACTIVATIONS", "OPTIMIZERS", "BottomSpec"]

ACTIVATIONS = ("relu", "tanh", "gelu")
OPTIMIZERS = ("adam", "adamw", "lamb", "sgd")


@dataclass(frozen=True, kw_only=True)
class BottomSpec:
    """How a party builds and trains its bottom (local) model.

    Attributes:
        hidden: sizes of the hidden layers (App. E chooses from {100, 200, 400}).
        out_dim: width of the cut layer, i.e. of the embedding the party sends.
        activation: hidden activation.
        dropout: dropout probability after each hidden layer.
        optimizer: optimiser name; lr and weight_decay as in App. E.
        seed: seeds the party's own parameter initialisation and dropout.
        standardize: z-score each numeric feature on the training rows before the bottom
            model; ``False`` feeds the raw values, as the FedSim authors' scripts do (they never
            call their ``scale`` option on the synthetic data, and on it the raw features train
            measurably better with LAMB: see the README's reproduction section).
    """

    hidden: tuple[int, ...] = (100,)
    out_dim: int = 16
    activation: str = "relu"
    dropout: float = 0.0
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 1e-5
    seed: int = 0
    standardize: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", tuple(self.hidden))
        problems: list[str] = []
        for i, h in enumerate(self.hidden):
            check_int(problems, f"hidden[{i}]", h, min=1)
        check_int(problems, "out_dim", self.out_dim, min=1)
        check_choice(problems, "activation", self.activation, ACTIVATIONS)
        check_float(problems, "dropout", self.dropout, min=0.0, max=0.95)
        check_choice(problems, "optimizer", self.optimizer, OPTIMIZERS)
        check_float(problems, "lr", self.lr, min=0.0, min_exclusive=True)
        check_float(problems, "weight_decay", self.weight_decay, min=0.0)
        check_int(problems, "seed", self.seed, min=0)
        if not isinstance(self.standardize, bool):
            problems.append(f"`standardize` must be true or false, got {self.standardize!r}")
        raise_if(problems, "model spec")
