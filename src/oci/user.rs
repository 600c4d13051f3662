//! Users and groups of a container process, resolved as containerd does it: from the CRI
//! security context or the image's `User`, with names looked up in the image's own
//! `/etc/passwd` and `/etc/group`.

use super::SpecError;

/// The uid, gid and supplementary groups a process runs with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResolvedUser {
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
}

/// The most supplementary groups a process may have (the kernel's `NGROUPS_MAX`).
pub const MAX_GROUPS: usize = 65536;

/// One line of `/etc/passwd`, borrowed from the file's text.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PasswdEntry<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
}

/// One line of `/etc/group`; its members stay one comma-separated field, looked through
/// only for the user at hand (an image's file may have millions of them).
#[derive(Debug, Clone, PartialEq, Eq)]
struct GroupEntry<'a> {
    name: &'a str,
    gid: u32,
    members: &'a str,
}

impl GroupEntry<'_> {
    fn has_member(&self, user: &str) -> bool {
        self.members.split(',').any(|m| m == user)
    }
}

fn parse_passwd(text: &str) -> Vec<PasswdEntry<'_>> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let uid = fields.nth(1)?.parse().ok()?;
            let gid = fields.next()?.parse().ok()?;
            Some(PasswdEntry { name, uid, gid })
        })
        .collect()
}

fn parse_group(text: &str) -> Vec<GroupEntry<'_>> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let gid = fields.nth(1)?.parse().ok()?;
            let members = fields.next().unwrap_or_default();
            Some(GroupEntry { name, gid, members })
        })
        .collect()
}

/// The image's account files (empty when the image has none), as `cri::container_rootfs`
/// reads them.
#[derive(Debug, Clone, Default)]
pub struct AccountFiles {
    pub passwd: String,
    pub group: String,
}

/// The user string as containerd builds it from the CRI fields: `uid` or `name`, with
/// `:gid` when a group is set; empty when nothing is set.
pub fn cri_user_string(
    run_as_user: Option<i64>,
    run_as_username: &str,
    run_as_group: Option<i64>,
) -> Result<String, SpecError> {
    let mut user = match run_as_user {
        Some(uid) => uid.to_string(),
        None => run_as_username.to_string(),
    };
    if let Some(gid) = run_as_group {
        if user.is_empty() {
            return Err(SpecError::Invalid(
                "run_as_group is set without run_as_user or run_as_username".to_string(),
            ));
        }
        user = format!("{user}:{gid}");
    }
    Ok(user)
}

/// Resolves `user` (`uid`, `name`, `uid:gid`, `name:group`, or empty for root) against the
/// image's account files, adding the groups that list the user and `supplemental` ones.
pub fn resolve(
    user: &str,
    files: &AccountFiles,
    supplemental: &[i64],
) -> Result<ResolvedUser, SpecError> {
    resolve_with_policy(user, files, supplemental, true)
}

/// Supplementary groups, each once and in ascending order (as containerd merges them), at
/// most [`MAX_GROUPS`].
#[derive(Default)]
struct Gids(std::collections::BTreeSet<u32>);

impl Gids {
    fn add(&mut self, gid: u32) -> Result<(), SpecError> {
        if !self.0.contains(&gid) && self.0.len() == MAX_GROUPS {
            return Err(SpecError::Invalid(format!(
                "the process would be in more than {MAX_GROUPS} supplementary groups"
            )));
        }
        self.0.insert(gid);
        Ok(())
    }
}

/// As [`resolve`]; with `merge_image_groups` false (the Strict supplemental groups
/// policy) the image's `/etc/group` memberships are not added.
///
/// The primary group is a supplementary group too, as containerd makes it since its fix for
/// CVE-2023-25173: otherwise a process could drop its primary group (setgroups is not
/// needed to keep supplementary groups) and get past a file denied to that group. Under the
/// Strict policy containerd adds it only when a user is named (`user` not empty), and so does
/// crius.
pub fn resolve_with_policy(
    user: &str,
    files: &AccountFiles,
    supplemental: &[i64],
    merge_image_groups: bool,
) -> Result<ResolvedUser, SpecError> {
    let passwd = parse_passwd(&files.passwd);
    let groups = parse_group(&files.group);
    let (user_part, group_part) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let (uid, primary_gid, name) = if user_part.is_empty() {
        (0, 0, passwd.iter().find(|p| p.uid == 0).map(|p| p.name))
    } else if let Ok(uid) = user_part.parse::<u32>() {
        let entry = passwd.iter().find(|p| p.uid == uid);
        (uid, entry.map_or(0, |e| e.gid), entry.map(|e| e.name))
    } else {
        let entry = passwd.iter().find(|p| p.name == user_part).ok_or_else(|| {
            SpecError::Invalid(format!(
                "user {user_part:?} not found in the image's /etc/passwd"
            ))
        })?;
        (entry.uid, entry.gid, Some(entry.name))
    };
    let gid = match group_part {
        None | Some("") => primary_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                groups
                    .iter()
                    .find(|e| e.name == g)
                    .ok_or_else(|| {
                        SpecError::Invalid(format!(
                            "group {g:?} not found in the image's /etc/group"
                        ))
                    })?
                    .gid
            }
        },
    };
    let mut additional_gids = Gids::default();
    if merge_image_groups || !user.is_empty() {
        additional_gids.add(gid)?;
    }
    if let Some(name) = name.filter(|_| merge_image_groups) {
        for group in groups
            .iter()
            .filter(|g| g.name != name && g.has_member(name))
        {
            additional_gids.add(group.gid)?;
        }
    }
    for g in supplemental {
        let g = u32::try_from(*g)
            .map_err(|_| SpecError::Invalid(format!("supplemental group {g} is out of range")))?;
        additional_gids.add(g)?;
    }
    let additional_gids = additional_gids.0.into_iter().collect();
    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> AccountFiles {
        AccountFiles {
            passwd: "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n".into(),
            group: "root:x:0:\nusers:x:100:user\nuser:x:1000:\nwheel:x:10:user,other\nnogroup:x:65534:\n".into(),
        }
    }

    #[test]
    fn an_image_may_not_put_a_user_in_more_groups_than_the_kernel_takes() {
        let group_file = |n: u32| -> String {
            (0..n)
                .map(|gid| format!("g{gid}:x:{}:other,user\n", gid + 2000))
                .collect()
        };
        // The primary group (1000) is one of them.
        let mut f = files();
        f.group = group_file(MAX_GROUPS as u32 - 1);
        let user = resolve("user", &f, &[2000, 1000]).unwrap();
        assert_eq!(
            user.additional_gids.len(),
            MAX_GROUPS,
            "2000 and 1000 are there once"
        );
        assert_eq!(user.additional_gids[..3], [1000, 2000, 2001]);
        f.group = group_file(MAX_GROUPS as u32);
        let err = resolve("user", &f, &[]).expect_err("too many groups");
        assert!(err.to_string().contains("65536"), "{err}");
        // Supplemental groups from the pod count too.
        f.group = group_file(MAX_GROUPS as u32 - 1);
        assert!(resolve("user", &f, &[1]).is_err());
    }

    #[test]
    fn names_and_numbers_resolve_like_containerd() {
        let f = files();
        // Root, from no user at all: root's own group and the groups listing root.
        let root = resolve("", &f, &[]).unwrap();
        assert_eq!((root.uid, root.gid, root.additional_gids), (0, 0, vec![0]));
        let user = resolve("user", &f, &[]).unwrap();
        assert_eq!((user.uid, user.gid), (1000, 1000));
        assert_eq!(user.additional_gids, vec![10, 100, 1000]);
        assert_eq!(resolve("1000", &f, &[]).unwrap().gid, 1000);
        // A uid the image does not know runs with gid 0, which it keeps as a group.
        assert_eq!(
            resolve("4242", &f, &[]).unwrap(),
            ResolvedUser {
                uid: 4242,
                gid: 0,
                additional_gids: vec![0]
            }
        );
        let nobody = resolve("nobody:users", &f, &[5]).unwrap();
        assert_eq!((nobody.uid, nobody.gid), (65534, 100));
        assert_eq!(nobody.additional_gids, vec![5, 100]);
        assert_eq!(resolve("1000:2000", &f, &[3000]).unwrap().gid, 2000);
        assert!(resolve("ghost", &f, &[]).is_err());
        assert!(resolve("user:ghosts", &f, &[]).is_err());
    }

    /// containerd's own cases (its TestAdditionalGids integration test and the
    /// SupplementalGroupsPolicy unit cases of its container spec).
    #[test]
    fn the_primary_group_is_a_supplementary_group_as_containerd_makes_it() {
        let mut f = files();
        f.passwd
            .push_str("daemon:x:1:1:daemon:/usr/sbin:/bin/false\n");
        f.group = "root:x:0:\ndaemon:x:1:\nwheel:x:10:root\nsoftware:x:11111:user\n".into();
        let gids = |user: &str, supplemental: &[i64], merge: bool| {
            resolve_with_policy(user, &f, supplemental, merge)
                .unwrap()
                .additional_gids
        };
        // `docker run`, `--group-add 1 --group-add 1234`, `--user 1234`, `--user 1234:1234`,
        // `--user 1234 --group-add 1234`, `--user daemon`, `--user daemon --group-add 1234`.
        assert_eq!(gids("", &[], true), [0, 10]);
        assert_eq!(gids("", &[1, 1234], true), [0, 1, 10, 1234]);
        assert_eq!(gids("1234", &[], true), [0]);
        assert_eq!(gids("1234:1234", &[], true), [1234]);
        assert_eq!(gids("1234", &[1234], true), [0, 1234]);
        assert_eq!(gids("daemon", &[], true), [1]);
        assert_eq!(gids("daemon", &[1234], true), [1, 1234]);
        // An image USER with a group, and a name with a group name.
        assert_eq!(gids("user:daemon", &[], true), [1, 11111]);
        // The Strict policy: the primary group and the pod's groups, not the image's.
        assert_eq!(gids("1000:2000", &[3333], false), [2000, 3333]);
        assert_eq!(gids("user", &[], false), [1000]);
        assert_eq!(gids("user", &[7], false), [7, 1000]);
        // ...and with no user named at all, only the pod's groups.
        assert_eq!(gids("", &[3333], false), [3333]);
        // Merge: the image's groups of the user as well.
        assert_eq!(gids("1000:2000", &[3333], true), [2000, 3333, 11111]);
        assert_eq!(gids("1000", &[], true), [1000, 11111]);
    }

    #[test]
    fn cri_fields_make_the_user_string() {
        assert_eq!(
            cri_user_string(Some(1000), "", Some(2000)).unwrap(),
            "1000:2000"
        );
        assert_eq!(cri_user_string(None, "nobody", None).unwrap(), "nobody");
        assert_eq!(cri_user_string(None, "", None).unwrap(), "");
        assert!(cri_user_string(None, "", Some(1)).is_err());
    }
}
