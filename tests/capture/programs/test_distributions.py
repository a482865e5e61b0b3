"""PYTEST_DONT_REWRITE

``torch.distributions`` made and used inside the compiled function, one graph under
``fullgraph=True``: constructors traced as Python (lazy properties, registries keyed
by classes, ``kl_divergence``'s cached dispatch), argument validation as eager's — the
check is assumed while tracing and tested after the graph, and a failing one re-runs
the frame eagerly, so the ValueError (or the ``except`` catching it) is eager's.
Sampling draws the same numbers as eager from the same seed, and leaves the same
random state, also when validation fails. (Loading PyTorch's compiler turns the
default validation off process-wide, so the programs that test it ask for it.)
"""
import pytest
import torch

import kiln

from .harness import TORCH_MODE, T, check, dynamo_bug, shapes

D = torch.distributions
PROGRAMS = []
ON_KILN = []
kiln_only = pytest.mark.skipif(TORCH_MODE, reason="kiln's backend")


def program(*shps, inputs=None, kiln=False, marks=()):
    def deco(f):
        PROGRAMS.append(pytest.param(f, id=f.__name__, marks=marks))
        if kiln:
            ON_KILN.append(pytest.param(f, id=f.__name__, marks=kiln_only))
        f.make_inputs = inputs or shapes(*(shps or ((2, 3),)))
        return f
    return deco


def _scale_flips_sign(i):
    """Valid scales on calls 0 and 2, a negative one on call 1 (eager raises)."""
    return T(2, 3), (T(2, 3).abs() + 0.1) * (-1 if i == 1 else 1)


@program()
def normal_log_prob(x):
    return D.Normal(x, torch.ones_like(x)).log_prob(x * 0.5)


@program(kiln=True)
def normal_moments(x):
    d = D.Normal(x, x.abs() + 1)
    return d.mean, d.stddev, d.variance, d.entropy()


@program()
def normal_no_validation(x):
    return D.Normal(x, x.abs() + 1, validate_args=False).log_prob(x)


_VALIDATION_SKIPPED = dynamo_bug("breaks: distribution validation is on its skip list (and loading "
                                 "PyTorch's compiler turns the default validation off)")


@program(inputs=_scale_flips_sign, kiln=True, marks=_VALIDATION_SKIPPED)
def normal_invalid_scale_raises_as_eager(x, s):
    return D.Normal(x, s, validate_args=True).log_prob(x * 0.5) * 2


@program(inputs=_scale_flips_sign, marks=_VALIDATION_SKIPPED)
def normal_invalid_scale_caught(x, s):
    try:
        d = D.Normal(x, s, validate_args=True)
    except ValueError:
        return x * 0
    return d.log_prob(x)


@program()
def normal_cdf_icdf(x):
    return D.Normal(x, 2.0).cdf(x * 0.1), D.Normal(0.0, 1.0).icdf(x.sigmoid())


@program(kiln=True)
def independent_log_prob(x):
    d = D.Independent(D.Normal(x, x.abs() + 1), 1)
    return d.log_prob(x), d.batch_shape, d.event_shape


@program()
def bernoulli_logits(x):
    return D.Bernoulli(logits=x).log_prob((x > 0).float())


@program()
def bernoulli_probs_entropy(x):
    return D.Bernoulli(probs=x.sigmoid()).entropy()


@program()
def categorical_log_prob(x):
    return D.Categorical(logits=x).log_prob(torch.tensor([0, 1]))


@program(kiln=True)
def categorical_entropy(x):
    return D.Categorical(logits=x).entropy()


@program()
def uniform_log_prob(x):
    return D.Uniform(x - 1, x + 1).log_prob(x)


@program()
def laplace_log_prob(x):
    return D.Laplace(x, x.abs() + 1).log_prob(x * 2)


@program(kiln=True)
def kl_normal_normal(x):
    return D.kl_divergence(D.Normal(x, x.abs() + 1), D.Normal(x * 0, 1 + x * 0))


@program()
def multivariate_normal_scale_tril(x):
    return D.MultivariateNormal(x[0], scale_tril=torch.eye(3) * 2).log_prob(x)


@program()
def beta_log_prob(x):
    return D.Beta(x.abs() + 1, x.abs() + 2).log_prob(x.sigmoid())


@program()
def lognormal_log_prob(x):
    return D.LogNormal(x, 1.0).log_prob(x.exp())


@program()
def transformed_distribution(x):
    d = D.TransformedDistribution(D.Normal(x, 1.0), [D.transforms.ExpTransform()])
    return d.log_prob(x.exp())


@pytest.mark.parametrize("fn", PROGRAMS)
def test_program(fn):
    check(fn, fn.make_inputs, graphs=1, fullgraph=True)


@pytest.mark.parametrize("fn", ON_KILN)
def test_program_on_kiln(fn):
    check(fn, fn.make_inputs, fullgraph=True, backend="kiln")


def _rsample(x, s):
    d = D.Independent(D.Normal(x, s, validate_args=True), 1, validate_args=True)
    y = d.rsample()
    return y, d.log_prob(y)


@pytest.mark.skipif(TORCH_MODE, reason="kiln's backends")
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_rsample_same_draws_and_random_state(backend):
    cf = kiln.compile(_rsample, backend=backend, fullgraph=True)
    for i in range(3):
        x, s = _scale_flips_sign(i)
        got = {}
        for name, f in (("eager", _rsample), ("compiled", cf)):
            torch.manual_seed(5)
            try:
                got[name] = (f(x, s), None)
            except ValueError as e:
                got[name] = (None, str(e))
            got[name] += (torch.get_rng_state(),)
        (e_out, e_err, e_rng), (c_out, c_err, c_rng) = got["eager"], got["compiled"]
        assert e_err == c_err
        assert torch.equal(e_rng, c_rng)
        if e_err is None:
            torch.testing.assert_close(c_out, e_out)
    kiln.reset()


@pytest.mark.skipif(TORCH_MODE, reason="kiln's own fallback")
def test_validation_with_an_input_written_in_place_runs_eagerly():
    """A failing check re-runs the frame; a graph that wrote into an input cannot be
    re-run, so that frame runs eagerly (still eager's answers)."""
    def f(x, s):
        x.add_(1)
        return D.Normal(x, s, validate_args=True).log_prob(x)
    check(f, _scale_flips_sign)
