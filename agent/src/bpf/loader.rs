//! Loading the object and attaching its programs, pinned or not; adopting what an earlier agent
//! of this build pinned, and setting aside pinned state that does not match this build.

use std::collections::HashMap;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Map, MapData},
    programs::{FEntry, FExit, Lsm, ProgramError, links::FdLink},
};
use tracing::{info, warn};

use super::{
    LoadError, MAPS, MapSizes, Maps, MeasureError, OBJECT, PROGRAMS, PinnedState, Preflight,
    TRACING_PROGRAMS, Traced, layout::program_names, open_cache, pinned,
};

/// Loads the program `$name` of the type `$kind` for its hook or function `$target` and attaches
/// it; with `$pinned`, its link is pinned (in place of one an interrupted start left) and
/// outlives the agent.
macro_rules! load_and_attach {
    ($ebpf:expr, $kind:ty, $name:expr, $target:expr, $btf:expr, $pinned:expr) => {{
        let name: &'static str = $name;
        let program: &mut $kind = $ebpf
            .program_mut(name)
            .and_then(|program| program.try_into().ok())
            .ok_or(LoadError::MissingProgram(name))?;
        program
            .load($target, $btf)
            .map_err(|err| LoadError::program("load", name, err))?;
        let link = program
            .attach()
            .map_err(|err| LoadError::program("attach", name, err))?;
        if let Some(state) = $pinned {
            let link = program
                .take_link(link)
                .map_err(|err| LoadError::program("attach", name, err))?;
            let path = state.link(name);
            let _ = std::fs::remove_file(&path);
            FdLink::from(link)
                .pin(&path)
                .map_err(|err| LoadError::pin(&path, err))?;
        }
    }};
}

/// Attaches the programs that count the kernel's dentry moves for the open verdict cache.
fn count_dentry_moves(
    ebpf: &mut Ebpf,
    btf: &Btf,
    pinned: &Option<PinnedState>,
) -> Result<(), LoadError> {
    for (name, traced) in TRACING_PROGRAMS {
        match traced {
            Traced::Entry(function) => load_and_attach!(ebpf, FEntry, *name, function, btf, pinned),
            Traced::Exit(function) => load_and_attach!(ebpf, FExit, *name, function, btf, pinned),
        }
    }
    Ok(())
}

/// The fast path's map (ebpf/programs/common.h) of `ebpf`: one value, mapped by parts.
fn fast_path(ebpf: &Ebpf) -> Result<&MapData, LoadError> {
    match ebpf.map("fast_path") {
        Some(Map::Array(map)) => Ok(map),
        _ => Err(LoadError::Map("fast_path")),
    }
}

/// Turns the open verdict cache off or on (open_cache::set_off).
fn set_open_cache_off(ebpf: &Ebpf, off: bool) -> Result<(), LoadError> {
    open_cache::set_off(fast_path(ebpf)?, off).map_err(|source| LoadError::MapSetup {
        name: "fast_path",
        source,
    })
}

pub(super) struct Programs {
    // Owns the programs, and their links unless pinned: dropping it detaches those.
    ebpf: Ebpf,
    /// Where maps and links are pinned, if they are.
    pinned: Option<PinnedState>,
    /// This start found the pinned state not matching the object and replaced it.
    replaced_pinned_state: bool,
}

impl Programs {
    /// Loads the object with its maps sized by `sizes` and attaches every program (unless an
    /// earlier agent of this build left them attached through pinned links), with maps and
    /// links pinned under `pinned`; returns the maps.
    pub fn load(pinned: Option<PinnedState>, sizes: &MapSizes) -> Result<(Self, Maps), LoadError> {
        Preflight::run().check()?;
        let btf = Btf::from_sys_fs().map_err(|err| LoadError::NoBtf(err.to_string()))?;
        let mut loader = EbpfLoader::new();
        loader.btf(Some(&btf));
        for (name, entries) in sizes.entries() {
            loader.map_max_entries(name, entries);
        }
        let mut adopted = false;
        let mut replaced = false;
        // Pinned maps of other sizes (the agent's configuration changed) are replaced like any
        // state that does not match.
        if let Some(state) = &pinned
            && let Some(mismatch) = state.mismatch(MAPS, sizes)
        {
            let aside = state
                .set_aside()
                .map_err(|err| LoadError::pin(&state.dir(), err))?;
            warn!(
                state = %aside.display(),
                "the pinned state does not match this build or its map sizes ({mismatch}): set \
                 aside, enforcing as it did until every policy is applied again, and replaced"
            );
            replaced = true;
        }
        if let Some(state) = &pinned {
            for dir in ["maps", "links"] {
                let dir = state.dir().join(dir);
                std::fs::create_dir_all(&dir).map_err(|err| LoadError::pin(&dir, err))?;
            }
            adopted = state.links_complete(program_names());
            open_cache::forget_pinned(&state.map("fast_path")).map_err(|source| {
                LoadError::MapSetup {
                    name: "fast_path",
                    source,
                }
            })?;
            for name in MAPS {
                loader.map_pin_path(name, state.map(name));
            }
        }
        let mut ebpf = loader.load(OBJECT)?;
        // Moves counted (the adopted programs count them) before any open is decided, and
        // remembered. On again after an agent that turned the cache off.
        let moves_counted = adopted
            || count_dentry_moves(&mut ebpf, &btf, &pinned)
                .inspect_err(|err| {
                    warn!(
                        error = %err,
                        "the open verdict cache is off: this kernel's dentry moves cannot be \
                         counted, so every open in a target with path rules resolves its path"
                    )
                })
                .is_ok();
        set_open_cache_off(&ebpf, !moves_counted)?;
        if !adopted {
            for name in PROGRAMS {
                load_and_attach!(ebpf, Lsm, *name, name, &btf, &pinned);
            }
        }
        let maps = Maps::take(&mut ebpf)?;
        let programs = Self {
            ebpf,
            pinned,
            replaced_pinned_state: replaced,
        };
        Ok((programs, maps))
    }

    /// The fast path's map: the target filter's and the open verdict cache's.
    pub fn fast_path(&self) -> Result<&MapData, LoadError> {
        fast_path(&self.ebpf)
    }

    pub fn replaced_pinned_state(&self) -> bool {
        self.replaced_pinned_state
    }

    /// Removes the pinned state of other builds: their programs detach.
    pub fn remove_other_builds(&self) -> std::io::Result<()> {
        if let Some(state) = &self.pinned {
            for other in state.others()? {
                pinned::remove(&other)?;
                info!(state = %other.display(), "removed the pinned state of another build");
            }
        }
        Ok(())
    }

    /// The ids of the attached programs, by the links they are attached through.
    pub fn ids(&self) -> Result<HashMap<u32, &'static str>, MeasureError> {
        let mut ids = HashMap::new();
        for name in program_names() {
            let id = match &self.pinned {
                Some(state) => FdLink::from(aya::programs::links::PinnedLink::from_pin(
                    state.link(name),
                )?)
                .info()?
                .program_id(),
                None => self
                    .ebpf
                    .program(name)
                    .ok_or(ProgramError::NotLoaded)?
                    .info()?
                    .id(),
            };
            ids.insert(id, name);
        }
        Ok(ids)
    }
}
