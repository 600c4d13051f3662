//! The image store: every image in crius's containerd namespace, keyed by image ID (the
//! config digest), with all the names (containerd image records) that point at it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::RwLock;

use super::id_index::IdIndex;
use crate::imagespec::manifest::ImageConfigFile;
use crate::imagespec::reference::Reference;

/// One image: its ID, the names that refer to it, and what CRI reports about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// `sha256:<config digest>`.
    pub id: String,
    /// containerd image record names: tags, digests and the ID itself.
    pub references: BTreeSet<String>,
    /// Those of the names whose record is labelled pinned (`io.cri-containerd.pinned`), as
    /// containerd's CRI reads them: kubelet's image garbage collection leaves such images.
    pub pinned_references: BTreeSet<String>,
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
    /// Counts reference removals; `removed_at` holds the count at each name's last removal,
    /// for reads of containerd that started before it.
    generation: u64,
    removed_at: HashMap<String, u64>,
    /// The generations reads in progress started at, with how many started at each.
    readers: BTreeMap<u64, usize>,
    /// How many removals make the next look for ones no read can need.
    prune_removals_at: usize,
}

/// Removals are looked at only by reads of containerd in progress that started before them
/// (a pull writing names, an event's read of a record). Once this many are remembered, those
/// no such read can need are forgotten, so clients removing ever new names do not grow the
/// store.
const REMOVALS_KEPT: usize = 1024;

impl Inner {
    /// Forgets the removals no read in progress started before.
    fn forget_unneeded_removals(&mut self) {
        let oldest_read = self
            .readers
            .keys()
            .next()
            .copied()
            .unwrap_or(self.generation);
        self.removed_at.retain(|_, at| *at > oldest_read);
    }
}

/// All images, safe to share.
#[derive(Default)]
pub struct ImageStore {
    inner: RwLock<Inner>,
    /// One lock per image name or ID changing in containerd and in the store together (see
    /// [`ImageStore::lock_names`]); gone once no one holds or waits for it.
    name_locks: crate::keyed_locks::KeyedLocks,
    /// Names crius keeps pinned (the sandbox image): their containerd records are labelled
    /// so, as containerd's CRI labels them.
    pinned_names: RwLock<std::collections::HashSet<String>>,
}

/// A read of the store's generation, registered until it drops: removals after it are
/// remembered while it lasts.
pub struct GenerationRead<'a> {
    store: &'a ImageStore,
    pub generation: u64,
}

impl Drop for GenerationRead<'_> {
    fn drop(&mut self) {
        let mut inner = self.store.write();
        if let Some(count) = inner.readers.get_mut(&self.generation) {
            *count -= 1;
            if *count == 0 {
                inner.readers.remove(&self.generation);
            }
        }
    }
}

/// An image read with its names locked: see [`ImageStore::resolve_locked`].
pub struct LockedImage<'a> {
    pub image: Image,
    /// The store's generation when the image was read.
    pub read: GenerationRead<'a>,
    _names: NameLocks,
}

/// Locks on image names and IDs: see [`ImageStore::lock_names`].
pub struct NameLocks {
    _held: Vec<tokio::sync::OwnedMutexGuard<()>>,
}

fn hex_of(id: &str) -> &str {
    id.strip_prefix("sha256:").unwrap_or(id)
}

impl ImageStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Names whose records crius labels pinned.
    pub fn pin_names(&self, names: impl IntoIterator<Item = String>) {
        self.pinned_names
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .extend(names);
    }

    /// Whether the records of `name` are to be labelled pinned.
    pub fn is_pinned_name(&self, name: &str) -> bool {
        self.pinned_names
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name)
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
            inner.forget_unneeded_removals();
            // What is left is needed: look again once as many more have come.
            inner.prune_removals_at = REMOVALS_KEPT.max(2 * inner.removed_at.len());
        }
        inner.removed_at.insert(reference.to_string(), generation);
        if let Some(id) = inner.by_reference.get(reference).cloned() {
            detach(&mut inner, reference, &id);
        }
    }

    /// Whether `reference` is exactly one of the names of an image held.
    pub fn holds_reference(&self, reference: &str) -> bool {
        self.read().by_reference.contains_key(reference)
    }

    /// Waits until no one else changes the image names (or image IDs) in `keys`, in
    /// containerd and here, and keeps it so until the locks drop: RemoveImage holds an
    /// image's names and ID from reading them to its last delete, a pull the names it writes
    /// from writing them to recording them, so neither records or deletes a name between
    /// the other's two steps (a tag moving to a newer image included). Locks are taken in
    /// order, so two holders of overlapping sets cannot wait for each other.
    pub async fn lock_names(&self, keys: impl IntoIterator<Item = String>) -> NameLocks {
        let keys: BTreeSet<String> = keys.into_iter().collect();
        let mut held = Vec::with_capacity(keys.len());
        for key in keys {
            held.push(self.name_locks.lock(&key).await);
        }
        NameLocks { _held: held }
    }

    /// The image `text` resolves to, with its names, its ID and the names in `also` locked
    /// (see [`Self::lock_names`]), and the store's generation it was read at. It is
    /// resolved again once the locks are held, as a pull or removal that held one may have
    /// changed the names: then the locks are taken again for the new names.
    pub async fn resolve_locked(
        &self,
        text: &str,
        also: &BTreeSet<String>,
    ) -> Option<LockedImage<'_>> {
        loop {
            let found = self.resolve(text)?;
            let mut keys = found.references.clone();
            keys.insert(found.id.clone());
            keys.extend(also.iter().cloned());
            let names = self.lock_names(keys.iter().cloned()).await;
            let (image, read) = {
                let mut inner = self.write();
                (resolve_in(&inner, text), self.register_read(&mut inner))
            };
            match image {
                Some(image) if image.id == found.id && image.references.is_subset(&keys) => {
                    return Some(LockedImage {
                        image,
                        read,
                        _names: names,
                    });
                }
                Some(_) => continue,
                None => return None,
            }
        }
    }

    /// Where the store is now, for [`Self::add_unless_removed_since`]: the removals after
    /// it are remembered until the read drops.
    pub fn read_generation(&self) -> GenerationRead<'_> {
        self.register_read(&mut self.write())
    }

    fn register_read(&self, inner: &mut Inner) -> GenerationRead<'_> {
        let generation = inner.generation;
        *inner.readers.entry(generation).or_default() += 1;
        GenerationRead {
            store: self,
            generation,
        }
    }

    /// Adds an image read from containerd when the store was at `generation`, without the
    /// names removed since: a read that raced a RemoveImage must not bring the image back.
    pub fn add_unless_removed_since(&self, mut image: Image, generation: u64) {
        let mut inner = self.write();
        image
            .references
            .retain(|r| inner.removed_at.get(r).is_none_or(|at| *at <= generation));
        if !image.references.is_empty() {
            add_to(&mut inner, image);
        }
    }

    /// Adds an image whose names were all in containerd when the store was at `generation`,
    /// unless one of them was removed since (a RemoveImage that raced the pull may have
    /// deleted it): then nothing is added and the answer is false.
    pub fn add_if_none_removed_since(&self, image: Image, generation: u64) -> bool {
        let mut inner = self.write();
        if image
            .references
            .iter()
            .any(|r| inner.removed_at.get(r).is_some_and(|at| *at > generation))
        {
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
            // The records just read say which of their names are pinned now.
            for reference in &image.references {
                if image.pinned_references.contains(reference) {
                    existing.pinned_references.insert(reference.clone());
                } else {
                    existing.pinned_references.remove(reference);
                }
            }
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
            image.pinned_references.remove(reference);
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
            pinned_references: BTreeSet::new(),
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
        let before = store.read_generation();
        store.remove_reference("busybox:latest");
        // ...and the read, made while the record still existed, lands.
        store.add_unless_removed_since(image("sha256:aaa", &["busybox:latest"]), before.generation);
        assert!(store.resolve("sha256:aaa").is_none());
        // A read that starts after the removal (a new pull) counts.
        let after = store.read_generation();
        store.add_unless_removed_since(image("sha256:aaa", &["busybox:latest"]), after.generation);
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
        let before = store.read_generation();
        store.remove_reference("busybox@sha256:ddd");
        assert!(!store.add_if_none_removed_since(found.clone(), before.generation));
        assert!(store.resolve("busybox@sha256:ddd").is_none());
        // Nothing removed since: added, every name.
        let now = store.read_generation();
        assert!(store.add_if_none_removed_since(found, now.generation));
        assert!(store.resolve("busybox@sha256:ddd").is_some());
        assert!(store.resolve("busybox:latest").is_some());
    }

    #[tokio::test]
    async fn an_image_locked_for_its_names_waits_and_is_read_again() {
        let store = ImageStore::new();
        store.add(image("sha256:aaa", &["busybox:latest"]));
        let held = store.lock_names(["sha256:aaa".to_string()]).await;
        let none = BTreeSet::new();
        let waiter = store.resolve_locked("busybox:latest", &none);
        tokio::pin!(waiter);
        assert!(futures::poll!(&mut waiter).is_pending());
        // Removed by the holder: nothing is left to lock.
        store.remove_reference("busybox:latest");
        drop(held);
        assert!(waiter.await.is_none());

        store.add(image("sha256:aaa", &["busybox:latest"]));
        let before = store.read_generation().generation;
        let locked = store
            .resolve_locked("busybox:latest", &BTreeSet::new())
            .await
            .unwrap();
        assert_eq!(locked.image.id, "sha256:aaa");
        assert_eq!(locked.read.generation, before);
        // Another image's names are not held up.
        drop(store.lock_names(["sha256:bbb".to_string()]).await);
    }

    #[tokio::test]
    async fn a_tag_that_moved_while_waiting_is_not_taken_with_the_old_image() {
        let store = ImageStore::new();
        store.add(image("sha256:aaa", &["app:latest", "sha256:aaa"]));
        // A pull of a newer image holds the tag while it writes it...
        let pull = store
            .lock_names(["app:latest".to_string(), "sha256:bbb".to_string()])
            .await;
        // ...when a removal of the old image by its ID comes.
        let none = BTreeSet::new();
        let removal = store.resolve_locked("sha256:aaa", &none);
        tokio::pin!(removal);
        assert!(futures::poll!(&mut removal).is_pending());
        store.add(image("sha256:bbb", &["app:latest", "sha256:bbb"]));
        drop(pull);
        let locked = removal.await.unwrap();
        assert_eq!(locked.image.id, "sha256:aaa");
        assert_eq!(
            locked.image.references,
            BTreeSet::from(["sha256:aaa".to_string()])
        );
    }

    #[test]
    fn removals_a_read_in_progress_may_need_are_kept_and_the_rest_forgotten() {
        let store = ImageStore::new();
        let remove_many = |from: usize, to: usize| {
            for i in from..to {
                let name = format!("r{i}:v1");
                store.add(image(&format!("sha256:{i:05x}"), &[name.as_str()]));
                store.remove_reference(&name);
            }
        };
        remove_many(0, 10);
        let early = store.read_generation();
        remove_many(10, 3 * REMOVALS_KEPT);
        // The read from before most removals still sees every one after it.
        store.add_unless_removed_since(image("sha256:0000a", &["r10:v1"]), early.generation);
        assert!(store.resolve("r10:v1").is_none());
        assert!(store.read().removed_at.len() >= 3 * REMOVALS_KEPT - 10);
        drop(early);
        // With no read in progress, the next look forgets them all.
        remove_many(3 * REMOVALS_KEPT, 5 * REMOVALS_KEPT);
        assert!(store.read().removed_at.len() < 3 * REMOVALS_KEPT);
        assert!(store.read().readers.is_empty());
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
