"""Unlearning objectives as LightningModules; each file states one loss (formulas in ``lightning_unlearn.losses``)."""

from lightning_unlearn.objectives.alphaedit import AlphaEdit
from lightning_unlearn.objectives.dpo import DPO
from lightning_unlearn.objectives.ga import GradientAscent
from lightning_unlearn.objectives.ga_retain import GARetain
from lightning_unlearn.objectives.gd import GradientDifference
from lightning_unlearn.objectives.idk_dpo import IdkDPO
from lightning_unlearn.objectives.idk_nll import IdkNLL
from lightning_unlearn.objectives.injection import InjectionModule
from lightning_unlearn.objectives.instruction import InstructionModule
from lightning_unlearn.objectives.memflex import MemFlex
from lightning_unlearn.objectives.npo import NPO
from lightning_unlearn.objectives.optimizer_config import OptimizerConfig
from lightning_unlearn.objectives.oracle_grad import OracleGrad
from lightning_unlearn.objectives.rmu import RMU
from lightning_unlearn.objectives.satimp import SatImp
from lightning_unlearn.objectives.simnpo import SimNPO
from lightning_unlearn.objectives.undial import UNDIAL
from lightning_unlearn.objectives.unlearning_module import UnlearningModule
from lightning_unlearn.objectives.wga import WGA

__all__ = [
    "AlphaEdit",
    "DPO",
    "GARetain",
    "GradientAscent",
    "GradientDifference",
    "IdkDPO",
    "IdkNLL",
    "MemFlex",
    "NPO",
    "OptimizerConfig",
    "OracleGrad",
    "RMU",
    "SatImp",
    "SimNPO",
    "UNDIAL",
    "UnlearningModule",
    "WGA",
    "InjectionModule",
    "InstructionModule",
]
