//! The image store: every image in crius's containerd namespace, keyed by image ID (the
//! config digest), with all the names (containerd image records) that point at it.

use std::collections::{BTreeSet, HashMap};
use std::sync::RwLock;

use super::id_index::IdIndex;
use crate::image::manifest::ImageConfigFile;
use crate::image::reference::Reference;

/// One image: its ID, the names that refer to it, and what CRI reports about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// `sha256:<config digest>`.
    pub id: String,
    /// containerd image record names: tags, digests and the ID itself.
    pub references: BTreeSet<String>,
    /// The chain ID of the top layer: the snapshot containers are made from.
    pub chain_id: String,
    /// Bytes of the image's documents and layers as stored (compressed).
    pub size: u64,
    pub config: ImageConfigFile,
}

impl Image {
    /// References of the form `repo:tag`.
    pub fn repo_tags(&self) -> Vec<String> {
        self.references
            .iter()
            .filter(|r| !r.contains('@') && !r.starts_with("sha256:"))
            .cloned()
            .collect()
    }

    /// References of the form `repo@sha256:...`.
    pub fn repo_digests(&self) -> Vec<String> {
        self.references
            .iter()
            .filter(|r| r.contains('@'))
            .cloned()
            .collect()
    }
}

#[derive(Default)]
struct Inner {
    images: HashMap<String, Image>,
    by_reference: HashMap<String, String>,
    /// Image IDs without the `sha256:` prefix.
    ids: IdIndex,
    /// Counts reference removals; `removed_at` holds the count at each name's last removal
    /// (and when it was), for reads of containerd that started before it.
    generation: u64,
    removed_at: HashMap<String, Removal>,
    /// How many removals make the next look for old ones.
    prune_removals_at: usize,
}

/// A name's last removal from the store.
#[derive(Debug, Clone, Copy)]
struct Removal {
    generation: u64,
    at: std::time::Instant,
}

/// Removals are looked at by reads of containerd that started before them (a pull writing
/// names, an event's read of a record): such a read takes seconds at most. Once this many
/// names are recorded, those removed longer than [`REMOVAL_MEMORY`] ago are forgotten, so
/// clients removing ever new names do not grow the store.
const REMOVALS_KEPT: usize = 1024;
const REMOVAL_MEMORY: std::time::Duration = std::time::Duration::from_secs(600);

/// Forgets the removals made before `cutoff`.
fn forget_removals_before(removed_at: &mut HashMap<String, Removal>, cutoff: std::time::Instant) {
    removed_at.retain(|_, removal| removal.at >= cutoff);
}

/// How many locks the images' names are spread over (see [`ImageStore::lock_names`]).
const NAME_LOCKS: usize = 32;

/// All images, safe to share.
pub struct ImageStore {
    inner: RwLock<Inner>,
    /// Held while an image's names change in containerd and in the store together.
    name_locks: Vec<tokio::sync::Mutex<()>>,
}

impl Default for ImageStore {
    fn default() -> Self {
        Self {
            inner: RwLock::default(),
            name_locks: (0..NAME_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        }
    }
}

/// An image read with its names locked: see [`ImageStore::resolve_locked`].
pub struct LockedImage<'a> {
    pub image: Image,
    /// The store's generation when the image was read.
    pub generation: u64,
    _names: tokio::sync::MutexGuard<'a, ()>,
}

fn hex_of(id: &str) -> &str {
    id.strip_prefix("sha256:").unwrap_or(id)
}

impl ImageStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an image or merges its references into the one with the same ID. A reference
    /// that pointed at another image moves.
    pub fn add(&self, image: Image) {
        add_to(&mut self.write(), image);
    }

    /// Forgets the name `reference`; an image left without names is removed.
    pub fn remove_reference(&self, reference: &str) {
        let mut inner = self.write();
        inner.generation += 1;
        let generation = inner.generation;
        if inner.removed_at.len() >= inner.prune_removals_at {
            if let Some(cutoff) = std::time::Instant::now().checked_sub(REMOVAL_MEMORY) {
                forget_removals_before(&mut inner.removed_at, cutoff);
            }
            // What is left is recent: look again once as many more have come.
            inner.prune_removals_at = REMOVALS_KEPT.max(2 * inner.removed_at.len());
        }
        inner.removed_at.insert(
            reference.to_string(),
            Removal {
                generation,
                at: std::time::Instant::now(),
            },
        );
        if let Some(id) = inner.by_reference.get(reference).cloned() {
            detach(&mut inner, reference, &id);
        }
    }

    /// Whether `reference` is exactly one of the names of an image held.
    pub fn holds_reference(&self, reference: &str) -> bool {
        self.read().by_reference.contains_key(reference)
    }

    /// Waits until no one else changes the names of the image `id` (in containerd and here),
    /// and keeps it so until the guard drops: RemoveImage holds it from reading the image's
    /// names to its last delete, a pull while it writes names and records them, so neither
    /// records or deletes a name in between the other's two steps. Images share the locks
    /// by a hash of their IDs.
    pub async fn lock_names(&self, id: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut hasher);
        let stripe = (hasher.finish() % self.name_locks.len() as u64) as usize;
        self.name_locks[stripe].lock().await
    }

    /// The image `text` resolves to, with its names locked (see [`Self::lock_names`]), and
    /// the store's generation it was read at; resolved again once the lock is held, as a
    /// pull or removal that held it may have changed the names.
    pub async fn resolve_locked(&self, text: &str) -> Option<LockedImage<'_>> {
        loop {
            let found = self.resolve(text)?;
            let guard = self.lock_names(&found.id).await;
            let (image, generation) = {
                let inner = self.read();
                (resolve_in(&inner, text), inner.generation)
            };
            match image {
                Some(image) if image.id == found.id => {
                    return Some(LockedImage {
                        image,
                        generation,
                        _names: guard,
                    });
                }
                // The name moved to another image meanwhile: lock that one.
                Some(_) => continue,
                None => return None,
            }
        }
    }

    /// Where the store is now, for [`Self::add_unless_removed_since`].
    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Adds an image read from containerd when the store was at `generation`, without the
    /// names removed since: a read that raced a RemoveImage must not bring the image back.
    pub fn add_unless_removed_since(&self, mut image: Image, generation: u64) {
        let mut inner = self.write();
        image.references.retain(|r| {
            inner
                .removed_at
                .get(r)
                .is_none_or(|removal| removal.generation <= generation)
        });
        if !image.references.is_empty() {
            add_to(&mut inner, image);
        }
    }

    /// Adds an image whose names were all in containerd when the store was at `generation`,
    /// unless one of them was removed since (a RemoveImage that raced the pull may have
    /// deleted it): then nothing is added and the answer is false.
    pub fn add_if_none_removed_since(&self, image: Image, generation: u64) -> bool {
        let mut inner = self.write();
        if image.references.iter().any(|r| {
            inner
                .removed_at
                .get(r)
                .is_some_and(|removal| removal.generation > generation)
        }) {
            return false;
        }
        add_to(&mut inner, image);
        true
    }

    /// Finds an image by name, by normalised reference, by ID or by unique ID prefix.
    pub fn resolve(&self, text: &str) -> Option<Image> {
        resolve_in(&self.read(), text)
    }

    pub fn get(&self, id: &str) -> Option<Image> {
        self.read().images.get(id).cloned()
    }

    pub fn list(&self) -> Vec<Image> {
        self.read().images.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.read().images.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A name, and its normalised form when that differs (`ctr import` keeps names as given,
/// such as `imported/app:v1`), so either finds the image.
fn lookup_keys(reference: &str) -> Vec<String> {
    let mut keys = vec![reference.to_string()];
    if let Ok(normalised) = Reference::parse(reference).map(|r| r.to_string())
        && normalised != reference
    {
        keys.push(normalised);
    }
    keys
}

/// [`ImageStore::resolve`] on the store's contents.
fn resolve_in(inner: &Inner, text: &str) -> Option<Image> {
    if let Some(id) = inner.by_reference.get(text) {
        return inner.images.get(id).cloned();
    }
    if let Some(image) = inner.images.get(text) {
        return Some(image.clone());
    }
    if let Ok(reference) = Reference::parse(text)
        && let Some(id) = inner.by_reference.get(&reference.to_string())
    {
        return inner.images.get(id).cloned();
    }
    let hex = hex_of(text);
    if hex.len() >= 3
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && let Ok(Some(full)) = inner.ids.get(hex)
    {
        return inner.images.get(&format!("sha256:{full}")).cloned();
    }
    None
}

/// Adds `image` to `inner`, merging its references into the image of the same ID.
fn add_to(inner: &mut Inner, image: Image) {
    for reference in &image.references {
        if let Some(old) = inner.by_reference.get(reference).cloned()
            && old != image.id
        {
            detach(inner, reference, &old);
        }
        for key in lookup_keys(reference) {
            inner.by_reference.insert(key, image.id.clone());
        }
    }
    let id = image.id.clone();
    match inner.images.get_mut(&id) {
        Some(existing) => {
            existing.references.extend(image.references);
            existing.chain_id = image.chain_id;
            existing.size = image.size;
            existing.config = image.config;
        }
        None => {
            inner.ids.insert(hex_of(&id));
            inner.images.insert(id, image);
        }
    }
}

fn detach(inner: &mut Inner, reference: &str, id: &str) {
    for key in lookup_keys(reference) {
        if inner
            .by_reference
            .get(&key)
            .is_some_and(|owner| owner == id)
        {
            inner.by_reference.remove(&key);
        }
    }
    let now_unnamed = match inner.images.get_mut(id) {
        Some(image) => {
            image.references.remove(reference);
            image.references.is_empty()
        }
        None => false,
    };
    if now_unnamed {
        inner.images.remove(id);
        inner.ids.remove(hex_of(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, refs: &[&str]) -> Image {
        Image {
            id: id.to_string(),
            references: refs.iter().map(|r| r.to_string()).collect(),
            chain_id: "sha256:chain".into(),
            size: 10,
            config: ImageConfigFile::default(),
        }
    }

    #[test]
    fn a_read_that_raced_a_removal_does_not_bring_the_name_back() {
        let store = ImageStore::new();
        store.add(image("sha256:aaa", &["busybox:latest"]));
        // An event's read of containerd starts, then RemoveImage removes the name...
        let before = store.generation();
        store.remove_reference("busybox:latest");
        // ...and the read, made while the record still existed, lands.
        store.add_unless_removed_since(image("sha256:aaa", &["busybox:latest"]), before);
        assert!(store.resolve("sha256:aaa").is_none());
        // A read that starts after the removal (a new pull) counts.
        let after = store.generation();
        store.add_unless_removed_since(image("sha256:aaa", &["busybox:latest"]), after);
        assert!(store.resolve("busybox:latest").is_some());
    }

    #[test]
    fn a_present_image_whose_name_was_removed_meanwhile_is_not_added() {
        let store = ImageStore::new();
        store.add(image(
            "sha256:aaa",
            &["busybox:latest", "busybox@sha256:ddd"],
        ));
        let found = store.resolve("busybox:latest").unwrap();
        let before = store.generation();
        store.remove_reference("busybox@sha256:ddd");
        assert!(!store.add_if_none_removed_since(found.clone(), before));
        assert!(store.resolve("busybox@sha256:ddd").is_none());
        // Nothing removed since: added, every name.
        let now = store.generation();
        assert!(store.add_if_none_removed_since(found, now));
        assert!(store.resolve("busybox@sha256:ddd").is_some());
        assert!(store.resolve("busybox:latest").is_some());
    }

    #[tokio::test]
    async fn an_image_locked_for_its_names_waits_and_is_read_again() {
        let store = ImageStore::new();
        store.add(image("sha256:aaa", &["busybox:latest"]));
        let held = store.lock_names("sha256:aaa").await;
        let waiter = store.resolve_locked("busybox:latest");
        tokio::pin!(waiter);
        assert!(futures::poll!(&mut waiter).is_pending());
        // Removed by the holder: nothing is left to lock.
        store.remove_reference("busybox:latest");
        drop(held);
        assert!(waiter.await.is_none());

        store.add(image("sha256:aaa", &["busybox:latest"]));
        let before = store.generation();
        let locked = store.resolve_locked("busybox:latest").await.unwrap();
        assert_eq!(locked.image.id, "sha256:aaa");
        assert_eq!(locked.generation, before);
    }

    #[test]
    fn removals_older_than_the_cutoff_are_forgotten() {
        let mut removed = HashMap::new();
        let then = std::time::Instant::now();
        let later = then + std::time::Duration::from_secs(1);
        removed.insert(
            "old:v1".to_string(),
            Removal {
                generation: 1,
                at: then,
            },
        );
        removed.insert(
            "new:v1".to_string(),
            Removal {
                generation: 2,
                at: later,
            },
        );
        forget_removals_before(&mut removed, later);
        assert!(removed.contains_key("new:v1"));
        assert!(!removed.contains_key("old:v1"));
    }

    #[test]
    fn recent_removals_are_kept_however_many() {
        let store = ImageStore::new();
        for i in 0..3 * REMOVALS_KEPT {
            let name = format!("r{i}:v1");
            store.add(image(&format!("sha256:{i:04x}"), &[name.as_str()]));
            store.remove_reference(&name);
        }
        // A read of containerd from before every removal brings none of the names back.
        store.add_unless_removed_since(image("sha256:0000", &["r0:v1"]), 0);
        assert!(store.resolve("r0:v1").is_none());
        assert!(store.read().removed_at.len() >= 3 * REMOVALS_KEPT);
    }

    const ID_A: &str = "sha256:aaaa1111";
    const ID_B: &str = "sha256:bbbb2222";

    #[test]
    fn resolves_by_name_normalised_reference_id_and_prefix() {
        let store = ImageStore::new();
        store.add(image(
            ID_A,
            &[
                "docker.io/library/busybox:latest",
                "docker.io/library/busybox@sha256:0000",
                ID_A,
            ],
        ));
        assert_eq!(store.resolve("busybox").unwrap().id, ID_A);
        assert_eq!(
            store
                .resolve("docker.io/library/busybox:latest")
                .unwrap()
                .id,
            ID_A
        );
        assert_eq!(store.resolve(ID_A).unwrap().id, ID_A);
        assert_eq!(store.resolve("aaaa").unwrap().id, ID_A);
        assert_eq!(store.resolve("sha256:aaaa").unwrap().id, ID_A);
        assert!(store.resolve("busybox:other").is_none());
        // Names kept as given are found by their normalised form too.
        store.add(image(ID_B, &["imported/app:v1"]));
        assert_eq!(store.resolve("docker.io/imported/app:v1").unwrap().id, ID_B);
        store.remove_reference("imported/app:v1");
        assert!(store.resolve("docker.io/imported/app:v1").is_none());
        let found = store.resolve("busybox").unwrap();
        assert_eq!(found.repo_tags(), vec!["docker.io/library/busybox:latest"]);
        assert_eq!(
            found.repo_digests(),
            vec!["docker.io/library/busybox@sha256:0000"]
        );
    }

    #[test]
    fn a_tag_moves_to_the_newer_image_and_empty_images_go() {
        let store = ImageStore::new();
        store.add(image(ID_A, &["docker.io/library/app:v1", ID_A]));
        store.add(image(ID_B, &["docker.io/library/app:v1", ID_B]));
        assert_eq!(store.resolve("app:v1").unwrap().id, ID_B);
        assert_eq!(store.get(ID_A).unwrap().references.len(), 1);
        store.remove_reference(ID_A);
        assert!(store.get(ID_A).is_none());
        assert!(store.resolve("aaaa").is_none());
        assert_eq!(store.len(), 1);
    }
}
