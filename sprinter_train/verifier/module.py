"""The LightningModule: SPRINTER §3.2's Linear(d, 1) + sigmoid (train.head=linear), or one
hidden ReLU layer before it (train.head=mlp, evaluate's ceiling probe made a verifier); BCE,
Adam.

The BCE takes the targets as given: 0/1 for the ratio label, the soft min(1, p/q) for the
accept_prob label (SpecDec++), whose minimiser is sigmoid(logit) = E[min(1, p/q) | s].

Inputs are standardised with the train split's statistics (buffers, so they travel with the
state dict across DDP ranks); `folded()` returns the equivalent weights on raw features,
which is what gets exported.
"""

from __future__ import annotations

import copy

import pytorch_lightning as pl
import torch
import torch.nn.functional as F


class VerifierModule(pl.LightningModule):
    def __init__(
        self,
        d_in: int,
        lr: float = 1e-2,
        weight_decay: float = 0.0,
        plateau_factor: float = 0.2,
        plateau_patience: int = 1,
        head: str = "linear",
        mlp_hidden: int = 256,
        mlp_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if head == "linear":
            self.linear = torch.nn.Linear(d_in, 1)
        elif head == "mlp":  # one hidden ReLU layer; dropout regularises it in training only
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(d_in, mlp_hidden),
                torch.nn.ReLU(),
                torch.nn.Dropout(mlp_dropout),
                torch.nn.Linear(mlp_hidden, 1),
            )
        else:
            raise ValueError(f"train.head must be linear or mlp, got {head!r}")
        self.register_buffer("mean", torch.zeros(d_in))
        self.register_buffer("scale", torch.ones(d_in))
        # where the best validation loss was seen: buffers come back from DDP ranks
        self.register_buffer("best_val_loss", torch.tensor(float("inf")))
        self.register_buffer("best_epoch", torch.tensor(-1))
        self.register_buffer("epochs_run", torch.tensor(0))

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and getattr(datamodule, "mean", None) is not None:
            self.mean.copy_(datamodule.mean)
            self.scale.copy_(datamodule.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the label's probability: P(q/p <= λ), or E[min(1, p/q)]."""
        return self.net((x - self.mean) / self.scale).squeeze(-1)

    @property
    def net(self) -> torch.nn.Module:
        """The head: SPRINTER's Linear(d, 1), or the MLP."""
        return self.linear if self.hparams.head == "linear" else self.mlp

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.binary_cross_entropy_with_logits(
            self(x), y
        )  # = BCE(sigmoid(logit), y), y in [0, 1]

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, on_step=False, on_epoch=True, batch_size=len(batch[1]))
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        loss = self._loss(batch)
        self.log("val_loss", loss, on_epoch=True, sync_dist=True, batch_size=len(batch[1]))

    def configure_optimizers(self) -> dict:
        """Adam; the lr shrinks when the val loss stalls (a large lr gets close fast, a small
        one settles: one million records converge in a handful of epochs)."""
        optimizer = torch.optim.Adam(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, factor=self.hparams.plateau_factor, patience=self.hparams.plateau_patience
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss", "interval": "epoch"},
        }

    def folded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w, b) with w·x + b equal to this module's logit on raw features x."""
        weight = self.linear.weight.detach()[0] / self.scale
        bias = self.linear.bias.detach()[0] - (weight * self.mean).sum()
        return weight, bias.reshape(1)

    def folded_mlp(self) -> dict[str, torch.Tensor]:
        """The MLP's tensors on raw features (checkpoint.MLPVerifier's names): the
        standardisation folded into its first layer, as `folded` does for the linear head."""
        first, last = self.mlp[0], self.mlp[3]
        weight = first.weight.detach() / self.scale[None, :]
        bias = first.bias.detach() - weight @ self.mean
        return {
            "weight": weight,
            "bias": bias,
            "out_weight": last.weight.detach().clone(),
            "out_bias": last.bias.detach().clone(),
        }


class KeepBest(pl.Callback):
    """Remember the weights of the lowest validation loss and restore them at the end
    (early stopping stops `patience` epochs after the best one)."""

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] | None = None

    def on_validation_end(self, trainer: pl.Trainer, module: VerifierModule) -> None:
        if trainer.sanity_checking or "val_loss" not in trainer.callback_metrics:
            return
        loss = float(trainer.callback_metrics["val_loss"])
        module.epochs_run.fill_(trainer.current_epoch + 1)
        if loss < float(module.best_val_loss):
            module.best_val_loss.fill_(loss)
            module.best_epoch.fill_(trainer.current_epoch)
            self.state = copy.deepcopy(module.net.state_dict())

    def on_train_end(self, trainer: pl.Trainer, module: VerifierModule) -> None:
        if self.state is not None:
            module.net.load_state_dict(self.state)
